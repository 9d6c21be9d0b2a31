"""`run --report` on the labelled simulator, the report opened in a real headless Chromium (offline, no
console errors), and the same study database opened unchanged in optuna-dashboard."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import optuna
import pytest
import yaml

from autotune.engine.process import find_free_port, spawn, stop_group
from autotune.report.browser import check_page, find_chromium

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)

REPO = Path(__file__).resolve().parents[2]   # the subprocess imports this checkout's autotune


@pytest.fixture(scope="module")
def sim_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A 4-trial study of an 8B model on two simulated H100s, with its report. (A 70B model here let every
    trial of an unlucky draw fail to fit: the sampler's seed differs per process, so the draw is not fixed.)"""
    tmp = tmp_path_factory.mktemp("report-sim")
    spec = {"name": "rep", "model": "llama-3.1-8b",
            "engine": {"kind": "sim", "gpu": "H100", "num_gpus": 2, "time_scale": 20,
                       "extra_flags": ["--max-model-len", "4096"], "startup_timeout_s": 60},
            "search_space": "default", "workload": {"kind": "random", "input_len": 512, "output_len": 64},
            "slo": "ttft:p99<=1s", "load": {"mode": "capacity", "search": "concurrency", "max_steps": 3,
                                            "requests_per_step": 40, "warmup": 2},
            "telemetry": {"source": "sim", "hz": 5}, "storage": f"sqlite:///{tmp}/rep.db", "seed": 0,
            "confirm": {"max_extra": 0}}
    (tmp / "rep.yaml").write_text(yaml.safe_dump(spec))
    report = tmp / "report.html"
    run = subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(tmp / "rep.yaml"), "--n-trials", "4",
                          "--no-progress", "--report", str(report)], cwd=tmp, capture_output=True, text=True,
                         timeout=600, start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"report: {report}" in run.stdout
    return tmp / "rep.db", report, f"sqlite:///{tmp}/rep.db"


@pytest.mark.browser
def test_report_renders_offline_in_chromium_without_console_errors(sim_study, tmp_path):
    if find_chromium() is None:
        pytest.skip("Chromium is not installed (Debian: `make chromium` as root, or apt-get install chromium)")
    _, report, _ = sim_study
    page = report.read_text()
    drawn = len(re.findall(r"Plotly\.newPlot\(", page))
    assert drawn >= 4
    shot = tmp_path / "shot.png"
    res = check_page(report, screenshot=shot)
    assert res.errors == []
    assert res.plots == drawn                       # every figure the page holds was drawn
    assert res.title == "autotune report: rep (SIMULATED)"
    assert res.text.startswith("SIMULATED") and "The trial export would deploy" in res.text
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_study_database_opens_unchanged_in_optuna_dashboard(sim_study, tmp_path):
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard (dev extra) is not installed")
    db, _, url = sim_study
    before = db.read_bytes()
    port = find_free_port()
    proc = spawn([sys.executable, "-c", "from optuna_dashboard._cli import main; main()", url,
                  "--host", "127.0.0.1", "--port", str(port)], tmp_path / "dashboard.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=10) as client:
            for _ in range(300):              # up to a minute for the dashboard to answer
                try:
                    studies = client.get("/api/studies").json()["study_summaries"]
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            else:
                pytest.fail("optuna-dashboard did not answer: " + (tmp_path / "dashboard.log").read_text()[-2000:])
            assert [s["study_name"] for s in studies] == ["rep"]
            assert studies[0]["directions"] == ["maximize", "minimize"]
            detail = client.get(f"/api/studies/{studies[0]['study_id']}").json()
    finally:
        stop_group(proc.pid, proc.pid, grace_s=5.0, popen=proc)
    assert proc.poll() is not None
    stored = optuna.load_study(study_name="rep", storage=url).get_trials(deepcopy=False)
    assert [t["number"] for t in detail["trials"]] == [t.number for t in stored]
    # what the dashboard plots are Optuna's values: for a candidate that failed, the placeholders
    for shown, t in zip(detail["trials"], stored):
        if t.values is not None:
            assert [float(v) for v in shown["values"]] == pytest.approx(t.values)
    assert db.read_bytes() == before               # reading it changed nothing
