"""Issue 27 end to end: past the knee of the throughput curve the load at which the SLO holds moves
between fresh servers while the tokens/s do not; the confirmation must keep the better configuration
and `export` must write it.

`autotune run` (the `vllm` engine, real processes and HTTP on loopback) starts
tests/fixtures/standin_vllm.py in its `plateau` mode: a batch of --max-num-seqs sequences, one token each
per 10 ms step, the rest queued. The first start of a configuration serves its queue in arrival order;
every later start (the confirmation's repeats) in a random order from a fixed seed, which leaves the
tokens/s where they were and stretches the TTFT's tail, so the repeats meet the SLO at about half the
streams the first run did. The order is fixed by the start count and the seed, and the outcome does
not hang on timing (the candidate's plateau is 4x the baseline's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "standin_vllm.py"


def _spec(tmp_path: Path, model: Path) -> Path:
    script = tmp_path / "standin_vllm.py"   # a copy under tmp_path: its processes are found by that path
    shutil.copy(STANDIN, script)
    (tmp_path / "starts").mkdir()
    spec: dict[str, Any] = {
        "name": "plateau", "model": str(model),
        "engine": {"kind": "vllm", "command": ["{python}", str(script)], "extra_flags": ["--max-model-len", "512"],
                   "env": {"STANDIN_MODE": "plateau", "STANDIN_STEP_MS": "10",
                           "STANDIN_STARTS_DIR": str(tmp_path / "starts")}, "startup_timeout_s": 30},
        "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 2, "high": 16}}},
        "workload": {"kind": "random", "input_len": 16, "output_len": 8},
        # 8 seqs x 100 steps/s = 800 tok/s, 100 req/s: in arrival order the p99 TTFT reaches 200 ms near 28
        # streams (Little: 28 / 100 s - 8 x 10 ms); in a random order a request waits ln(100) = 4.6 times
        # the queue's turn at p99, so near 12
        "slo": "ttft:p99<=200ms",
        "objectives": ["capacity_tps", "p50_tpot_ms"],
        "load": {"mode": "capacity", "search": "concurrency", "max_steps": 4, "requests_per_step": 8, "warmup": 0,
                 "min_waves": 2, "refine_steps": 0, "max_bracket": 1.0, "stall_timeout_s": 30},
        "telemetry": {"source": "none"},
        "storage": f"sqlite:///{tmp_path}/plateau.db",
        "enqueue": [{"max_num_seqs": 8}],
        "confirm": {"top_k": 1, "repeats": 3, "max_extra": 0},
        "warm_start": False, "early_stop": False,
    }
    path = tmp_path / "plateau.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_plateau_whose_load_wanders_is_confirmed_and_exported(tmp_path: Path, demo_model_dir: Path,
                                                                 capsys) -> None:
    spec = _spec(tmp_path, demo_model_dir)
    assert main(["run", "--study", str(spec), "--n-trials", "2", "--no-progress"]) == 0
    url = f"sqlite:///{tmp_path}/plateau.db"
    capsys.readouterr()
    assert main(["show", "--storage", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    conf = shown["confirmations"]
    assert set(conf) == {"0", "1"} and conf["1"]["repeats"] == 3
    # the scenario: the repeats met the SLO at fewer streams than the first run's bracket (the rule that
    # dropped such a candidate compared exactly these), at tokens/s the first run's
    first_low = conf["1"]["first_run_bracket"][0]
    assert sorted(conf["1"]["loads"])[1] < first_low, conf["1"]
    assert 0.75 < conf["1"]["medians"]["capacity_tps"] / conf["1"]["first_run"]["capacity_tps"] < 1.33, conf["1"]
    # survival and the export by the objectives: it stays, beats the baseline in every round, and is exported
    assert conf["1"]["survives"] and conf["0"]["survives"]
    verdict = conf["1"]["verdict"][0]
    assert verdict["objective"] == "capacity_tps" and verdict["beyond_noise"] and verdict["ratio"] > 2, verdict
    assert shown["best"] == 1 and shown["best_confirmed"]
    out = tmp_path / "best.yaml"
    assert main(["export", "--storage", url, "--format", "vllm-yaml", "-o", str(out)]) == 0
    text = out.read_text()
    assert "trial 1 (enqueued)" in text and "max-num-seqs: 8" in text
    assert "# against the baseline: capacity_tps x" in text and ": better" in text
