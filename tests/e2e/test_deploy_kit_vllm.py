"""The deploy kit against vLLM's CPU build: a one-trial study measures the demo model's capacity, the kit
exported from its database starts vLLM, passes its smoke test at 80 % of that capacity, takes an override
on a redeploy (read back from the server's own log), and stops everything it started."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from autotune.engine.process import find_free_port, port_free, stop_group

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, model: Path) -> Path:
    spec = {
        "name": "kit", "model": str(model),
        "engine": {"kind": "vllm", "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
                   "extra_flags": ["--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager"],
                   "startup_timeout_s": 600},
        "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 2, "high": 16}}},
        "baseline": {"gpu_memory_utilization": 0.15, "max_num_seqs": 8},
        "workload": {"kind": "random", "input_len": 64, "output_len": 16},
        # with 8 sequences in a batch the queue sets TTFT: the capacity is bracketed, and every step holds
        # several closed-loop waves (a step shorter than a wave would overstate the capacity)
        "slo": "ttft:p99<=1500ms",
        "load": {"mode": "capacity", "search": "concurrency", "max_steps": 4, "requests_per_step": 96, "warmup": 8},
        "telemetry": {"source": "cpu", "hz": 5}, "storage": f"sqlite:///{tmp_path}/kit.db",
    }
    path = tmp_path / "kit.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _family(pid: int) -> list[int]:
    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_deploy_smoke_override_stop(tmp_path: Path, demo_model_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    sh = lambda *args, timeout=1200, **extra: subprocess.run(  # noqa: E731
        [str(a) for a in args], cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=timeout)
    # the kit's mechanics are under test, not the choice of the trial (tests/unit/test_verdict.py): one
    # measured trial, unconfirmed; on a 2-core box its client may flag itself saturated, so the export
    # names the trial and accepts its flags in so many words
    run = sh(sys.executable, "-m", "autotune", "run", "--study", _spec(tmp_path, demo_model_dir), "--n-trials", "1",
             "--no-progress", "--no-confirm")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with sqlite3.connect(tmp_path / "kit.db") as conn:
        (capacity_json,) = conn.execute("select json_extract(capacity, '$.capacity') from autotune_trials").fetchone()
    capacity = float(capacity_json)
    assert capacity >= 1

    kit = tmp_path / "kit"
    export = sh(sys.executable, "-m", "autotune", "export", "--storage", f"sqlite:///{tmp_path}/kit.db",
                "--format", "deploy-kit", "-o", kit, "--trial", "0", "--accept-flagged")
    assert export.returncode == 0, export.stderr
    port = find_free_port()
    net = {"HOST": "127.0.0.1", "PORT": str(port), "STARTUP_TIMEOUT": "600"}
    pids: list[int] = []
    try:
        up = sh(kit / "deploy.sh", **net)
        assert up.returncode == 0, up.stdout + up.stderr + (kit / "run" / "vllm.log").read_text()[-3000:]
        first = int((kit / "run" / "vllm.pid").read_text())
        pids += _family(first)
        assert "'max_num_seqs': 8" in (kit / "run" / "vllm.log").read_text()

        # The load is 80 % of the capacity in the database. The SLO checked is looser than the study's:
        # on this shared 2-core machine the server's speed moves several-fold between the study and the
        # smoke (measured: 753 output tok/s at 29 streams in the study, 230 at 23 in the smoke a minute
        # later), which the study's own 1.5 s bound cannot absorb. A 1 ms bound shows the check is live.
        load = max(1, math.floor(0.8 * capacity))
        smoke = sh(kit / "smoke.sh", SMOKE_SLO="ttft:p99<=30s", **net)
        assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
        assert f"{max(16, 3 * load)} requests at concurrency {load} (measured capacity {capacity}" in smoke.stdout
        assert "SLO check: passed" in smoke.stdout and smoke.stdout.rstrip().endswith("smoke: passed")
        strict = sh(kit / "smoke.sh", SMOKE_SLO="ttft:p99<=1ms", SMOKE_REQUESTS="8", **net)
        assert strict.returncode == 1 and "SLO check: FAILED (slo:ttft:p99 over by" in strict.stdout
        assert "smoke: FAILED: the SLO was not met" in strict.stderr

        again = sh(kit / "deploy.sh", MAX_NUM_SEQS="4", **net)
        assert again.returncode == 0, again.stdout + again.stderr
        second = int((kit / "run" / "vllm.pid").read_text())
        assert second != first and not _alive(pids)          # the redeploy replaced the first server
        pids += _family(second)
        log = (kit / "run" / "vllm.log").read_text()
        assert re.search(r"non-default args: \{.*'max_num_seqs': 4\b", log), log[-3000:]

        down = sh(kit / "stop.sh", timeout=120)
        assert down.returncode == 0 and "stopped vLLM" in down.stdout, down.stdout + down.stderr
        assert not _alive(pids) and not (kit / "run" / "vllm.pid").exists() and port_free(port)
        assert "not running" in sh(kit / "stop.sh", timeout=60).stdout
    finally:
        for pid in _alive(pids):
            stop_group(pid, pid, grace_s=5.0)
