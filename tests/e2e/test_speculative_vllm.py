"""Speculative decoding, opted into, on the real vLLM CPU build: its n-gram proposer runs there, and its
/metrics counts draft and accepted tokens as the GPU build's does. A study with `speculative: {enabled:
true}` launches the draft config for its candidate and never for the baseline; `show` gives the acceptance
rate of each trial that ran one and the random-weights label, and the report carries the label too.

The demo model's weights are random and its output is noise, so drafts are proposed only where the noise
repeats the context: with the shipped spaces' 2-token look-ups, 12 requests of 128 in / 32 out proposed
none on this box; with 1-token look-ups they proposed 208 draft tokens and none was accepted. The draft
config here looks up 1-token n-grams so that the server has drafts to count; the acceptance asserted is
the server's own count, whatever it is."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

AUTOTUNE = [sys.executable, "-m", "autotune"]
REPO = Path(__file__).resolve().parents[2]
NGRAM_1 = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _autotune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*AUTOTUNE, *args], capture_output=True, text=True, timeout=1200, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})   # servers inherit the cwd


def _args_line(log_path: str) -> str:
    return next(line for line in Path(log_path).read_text().splitlines() if "non-default args" in line)


def test_an_opted_in_study_shows_the_real_servers_acceptance_and_the_random_weights_label(
        tmp_path: Path, demo_model_dir: Path, servers_in, one_process_env) -> None:
    db = tmp_path / "spec.db"
    spec = {
        "name": "spec-e2e", "model": str(demo_model_dir),
        "engine": {"kind": "vllm", "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
                   # a small memory fraction for every launch: vLLM's default does not fit beside the suite
                   "extra_flags": ["--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager",
                                   "--gpu-memory-utilization", "0.1"],
                   "startup_timeout_s": 600, "env": one_process_env},
        "search_space": {"params": {"speculative_config": {
            "type": "categorical", "opt_in": "speculative", "json": True, "default": "none",
            "choices": {"none": None, "ngram-1": NGRAM_1}}}},
        "speculative": {"enabled": True},
        "enqueue": [{"speculative_config": "ngram-1"}],
        "workload": {"kind": "random", "input_len": 128, "output_len": 32},
        "slo": "ttft:p99<=30s", "objectives": ["output_tps", "p50_tpot_ms"],
        "load": {"mode": "fixed", "concurrency": 2, "num_requests": 12, "warmup": 0},
        "telemetry": {"source": "none"}, "storage": f"sqlite:///{db}",
        # the confirmation's six more servers add nothing here: tests/e2e/test_tuning_loop.py confirms on
        # the real engine
        "confirm": {"enabled": False}, "sampler": "random", "warm_start": False,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    run = _autotune("run", "--study", str(tmp_path / "s.yaml"), "--n-trials", "2", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not servers_in(tmp_path, "vllm.entrypoints.openai.api_server")

    with sqlite3.connect(db) as conn:
        rows = conn.execute("select number, role, state, flags, metrics, log_path from autotune_trials "
                            "order by number").fetchall()
    (_, role0, state0, flags0, metrics0, log0), (_, role1, state1, flags1, metrics1, log1) = rows
    assert (role0, state0, role1, state1) == ("baseline", "ok", "enqueued", "ok"), rows
    assert "--speculative-config" not in json.loads(flags0) and "speculative_config" not in _args_line(log0)
    assert "--speculative-config" in json.loads(flags1)
    assert "'method': 'ngram'" in _args_line(log1)          # what vLLM itself says it was started with
    m0, m1 = json.loads(metrics0), json.loads(metrics1)
    assert "spec_acceptance_pct" not in m0                    # no drafts: the baseline never speculated
    # (the runner reads /metrics again when a read fails: one failed read on this busy box once left the
    # trial without its counters and the test with a KeyError; the message says what the trial has)
    assert m1.get("spec_draft_tokens", 0) > 0 and 0.0 <= m1["spec_acceptance_pct"] <= 100.0, m1

    shown = _autotune("show", "--storage", f"sqlite:///{db}", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["trials"][0]["spec_acceptance_pct"] is None
    assert data["trials"][1]["spec_acceptance_pct"] == pytest.approx(m1["spec_acceptance_pct"])
    assert data["speculative_label"].startswith("SPECULATIVE DECODING measured on random weights and synthetic")
    text = _autotune("show", "--storage", f"sqlite:///{db}", cwd=tmp_path).stdout
    assert "spec acc %" in text and "SPECULATIVE DECODING measured on random weights" in text
    report = tmp_path / "r.html"
    assert _autotune("report", "--storage", f"sqlite:///{db}", "-o", str(report), cwd=tmp_path).returncode == 0
    assert "SPECULATIVE DECODING measured on random weights" in report.read_text()
