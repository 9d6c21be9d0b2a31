"""Tune on your own traffic, for real: a gateway log with private text is converted `--lengths-only`, a
study on the vLLM CPU build replays it with capacity found by scaling the trace's rate, and no artefact
(the converted trace, the study database, the trial logs, `run` and `show` output) holds any of the text."""

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
MARKER = "PLATYPUS-INTERNAL-5581"


def gateway_log(path: Path) -> Path:
    """Six three-turn conversations under one system prompt, started 0.8 s apart, and six lone
    completions; the marker in every prompt, answer and user id."""
    lines, t0 = [], 1748772000.0
    for c in range(6):
        history = [{"role": "system", "content": f"You are the {MARKER} assistant; answer about the cache."}]
        for k in range(3):
            history = history + [{"role": "user", "content": f"{MARKER} question {c}.{k} about the server"}]
            answer = f"{MARKER} answer {c}.{k}"
            lines.append({"timestamp": t0 + 0.8 * c + 1.5 * k, "user": MARKER, "request": {
                "model": "m", "messages": history}, "response": {"choices": [{"message": {"content": answer}}],
                "usage": {"prompt_tokens": 20 + 12 * k, "completion_tokens": 6}}, "duration_ms": 300})
            history = history + [{"role": "assistant", "content": answer}]
    for i in range(6):
        lines.append({"timestamp": t0 + 0.4 + 0.9 * i, "request": {"prompt": f"{MARKER} complete {i}",
                      "max_tokens": 6}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_study_on_a_private_trace_with_capacity_by_rate_scaling(tmp_path: Path, demo_model_dir: Path,
                                                                servers_in, one_process_env) -> None:
    trace = tmp_path / "trace.jsonl"
    conv = subprocess.run([*AUTOTUNE, "convert", str(gateway_log(tmp_path / "gateway.jsonl")), "-o", str(trace),
                           "--tokenizer", str(demo_model_dir), "--lengths-only"], capture_output=True, text=True,
                          timeout=120)
    assert conv.returncode == 0, conv.stderr
    assert "24 of 24 requests" in conv.stdout and "6 multi-turn conversations" in conv.stdout
    db = tmp_path / "trace.db"
    spec = {
        "name": "trace-e2e", "model": str(demo_model_dir),
        "engine": {"kind": "vllm", "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
                   "extra_flags": ["--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager"],
                   "startup_timeout_s": 600, "env": one_process_env},
        "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 4, "high": 16, "log": True}}},
        "baseline": {"gpu_memory_utilization": 0.1},
        "workload": {"kind": "trace", "path": str(trace)},
        "slo": "ttft:p99<=3s",
        "load": {"mode": "capacity", "search": "time_scale", "max_steps": 3, "requests_per_step": 24, "warmup": 2,
                 "endpoint": "chat"},
        "telemetry": {"source": "cpu", "hz": 5},
        "storage": f"sqlite:///{db}",
        # the confirmation's three more servers add nothing here: it has its own test on the real engine
        # (tests/e2e/test_vlm_study.py) and the trace's replay is the same in a repeat
        "confirm": {"enabled": False},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    run = subprocess.run([*AUTOTUNE, "run", "--study", str(tmp_path / "s.yaml"), "--n-trials", "1", "--no-progress"],
                         capture_output=True, text=True, timeout=1200, cwd=tmp_path,  # servers inherit the cwd
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert not servers_in(tmp_path, "vllm.entrypoints.openai.api_server")

    with sqlite3.connect(db) as conn:
        state, capacity, metrics = conn.execute("select state, capacity, metrics from autotune_trials").fetchone()
        dump = "\n".join(conn.iterdump())
    cap = json.loads(capacity)
    assert state == "ok" and cap["mode"] == "time_scale" and cap["capacity"] > 0, cap
    loads = [s["load"] for s in cap["steps"]]
    assert len(loads) >= 2 and all(s["completed"] > 0 for s in cap["steps"])
    assert cap["capacity"] == max(s["load"] for s in cap["steps"] if s["slo_met"])   # x the trace's rate
    m = json.loads(metrics)
    assert m["completed"] == 22 and "p99_send_drift_ms" in m and m["request_rate"] > 0   # the trace after 2 warm-up

    show = subprocess.run([*AUTOTUNE, "show", "--storage", f"sqlite:///{db}"], capture_output=True, text=True,
                          timeout=60)
    show_json = subprocess.run([*AUTOTUNE, "show", "--storage", f"sqlite:///{db}", "--json"], capture_output=True,
                               text=True, timeout=60)
    assert show.returncode == 0 and "workload: 24 requests" in show.stdout and "inter-arrival CV" in show.stdout
    profile = json.loads(show_json.stdout)["workload_profile"]
    assert profile["conversations"] == 6 and profile["prefix_share_pct"] > 20 and profile["arrivals"]["span_s"] > 4

    logs = [p.read_text(errors="replace") for p in tmp_path.rglob("*.log")]
    assert logs, "the trial's server log should be there"
    for artefact in (trace.read_text(), dump, *logs, run.stdout, run.stderr, show.stdout, show_json.stdout):
        assert MARKER not in artefact and "PLATYPUS" not in artefact
