"""Confirmation on vLLM's CPU build: a one-trial study (the baseline) is confirmed by the end of `run` on
three freshly started servers with tiny steps, through the same trial runner; the repeats are stored
with their own logs and seeds, and `export` writes the confirmed baseline with its spread."""

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

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}   # this checkout's autotune, whatever the venv has installed


def test_run_confirms_the_baseline_on_fresh_vllm_servers(tmp_path: Path, demo_model_dir: Path, servers_in) -> None:
    spec = {
        "name": "e2e-confirm", "model": str(demo_model_dir),
        "engine": {"kind": "vllm", "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
                   "extra_flags": ["--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager"],
                   "startup_timeout_s": 300},
        "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 4, "high": 16, "log": True}}},
        "baseline": {"gpu_memory_utilization": 0.1},
        "workload": {"kind": "random", "input_len": 32, "output_len": 8},
        "slo": "ttft:p99<=3s",
        "load": {"mode": "capacity", "search": "concurrency", "max_steps": 2, "requests_per_step": 8, "warmup": 1,
                 "min_waves": 1, "refine_steps": 0},
        "telemetry": {"source": "cpu", "hz": 2},
        "confirm": {"top_k": 1, "repeats": 3},
        "storage": f"sqlite:///{tmp_path}/c.db",
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(spec))
    run = subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(path), "--n-trials", "1",
                          "--no-progress"], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=ENV)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "confirmation: #0 x 3 rounds" in run.stderr
    with sqlite3.connect(tmp_path / "c.db") as conn:
        rows = conn.execute("select round, seed, state, objectives, log_path, capacity from autotune_confirmations "
                            "order by round").fetchall()
        (first_run,), = conn.execute("select capacity from autotune_trials").fetchall()
    assert [r[0] for r in rows] == [0, 1, 2] and len({r[1] for r in rows}) == 3
    met = json.loads(first_run)["bracket"][0]
    for _, _, state, objectives, log_path, capacity in rows:
        assert state == "ok" and json.loads(objectives)["capacity_tps"] > 0
        assert Path(log_path).name.startswith("confirm-0000-r") and Path(log_path).is_file()
        # each repeat starts at the first run's highest met load; the stored loads are numbers
        assert json.loads(capacity)["steps"][0]["load"] == float(int(met))
    show = json.loads(subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", spec["storage"], "--json"],
                                     capture_output=True, text=True, timeout=60, env=ENV).stdout)
    assert show["confirmations"]["0"]["repeats"] == 3
    out = tmp_path / "best.yaml"
    exp = subprocess.run([sys.executable, "-m", "autotune", "export", "--storage", spec["storage"], "--format",
                          "vllm-yaml", "-o", str(out)], capture_output=True, text=True, timeout=60, env=ENV)
    if show["confirmations"]["0"]["survives"]:
        assert exp.returncode == 0, exp.stderr
        head = out.read_text()
        assert "# confirmed: 3 repeats on fresh servers: capacity_tps" in head and "spread" in head
        assert "# this is the baseline (vLLM's defaults)" in head
    else:    # a repeat failed or broke the SLO at every load: said, and nothing exported
        assert exp.returncode == 1 and "the baseline #0 did not survive its repeats" in exp.stderr
    assert not servers_in(tmp_path, "vllm.entrypoints.openai.api_server")
