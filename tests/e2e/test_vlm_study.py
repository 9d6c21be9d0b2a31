"""A study with image traffic on vLLM's CPU build (issue 25): studies/demo-cpu-vlm.yaml cut to one trial
(the baseline) with tiny steps, so it costs the four server starts it cannot do without: the trial and
three confirmation rounds. The multimodal knobs join the space and pass the engine's own --help check;
the trial's figures and constraints are per class; the confirmed result exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}   # this checkout's autotune, whatever the venv has installed


def _log_tails(root: Path) -> str:
    """The end of every server log the study kept: why a start failed, when one did."""
    return "".join(f"\n--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                   for p in sorted(root.rglob("*.log")))


def test_a_vlm_study_with_image_traffic_runs_confirms_and_exports(tmp_path: Path, demo_vlm_dir: Path, servers_in) -> None:
    spec = yaml.safe_load((REPO / "studies" / "demo-cpu-vlm.yaml").read_text())
    spec["workload"]["share"] = 0.5          # a handful of requests a step: both classes in every one
    spec.update(model=str(demo_vlm_dir), storage=f"sqlite:///{tmp_path}/v.db", slo="ttft[image]:p99<=8s,ttft[text]:p99<=5s",
                telemetry={"source": "cpu", "hz": 2}, warm_start=False,
                load={"mode": "capacity", "search": "concurrency", "max_steps": 2, "requests_per_step": 12,
                      "warmup": 1, "min_waves": 1, "refine_steps": 0})
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(spec))
    run = subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(path), "--n-trials", "1",
                          "--no-progress"], capture_output=True, text=True, timeout=3000, cwd=tmp_path, env=ENV)
    assert run.returncode == 0 and "confirmation: #0 x 3 rounds" in run.stderr, run.stderr[-2000:] + _log_tails(tmp_path)
    show = json.loads(subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", spec["storage"], "--json"],
                                     capture_output=True, text=True, timeout=60, env=ENV).stdout)
    trial = show["trials"][0]
    assert set(trial["slo_margins"]) == {"slo:ttft[image]:p99", "slo:ttft[text]:p99"}
    assert show["confirmations"]["0"]["repeats"] == 3
    import sqlite3
    with sqlite3.connect(tmp_path / "v.db") as conn:
        (metrics,), = conn.execute("select metrics from autotune_trials").fetchall()
    m = json.loads(metrics)
    assert m["image_completed"] > 0 and m["text_completed"] > 0 and m["images_per_s"] > 0
    out = tmp_path / "best.yaml"
    exp = subprocess.run([sys.executable, "-m", "autotune", "export", "--storage", spec["storage"], "--format",
                          "vllm-yaml", "-o", str(out)], capture_output=True, text=True, timeout=60, env=ENV)
    if show["confirmations"]["0"]["survives"]:
        assert exp.returncode == 0, exp.stderr
        assert "# confirmed: 3 repeats on fresh servers" in out.read_text()
    else:    # the median capacity fell below the first run's bracket: said, and nothing exported
        assert exp.returncode == 1 and "no candidate survived confirmation" in exp.stderr
    assert not servers_in(tmp_path, "vllm.entrypoints.openai.api_server")
