"""The twin's ranking runs in processes of its own beside the baseline's server start (labelled simulator,
real processes, real HTTP, the real twin): the baseline's load starts when its server is ready with the
picks of what is ranked by then, the picks still run right after the baseline, and a second study with
the same model, GPU, workload and space takes the ranking from the cache."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.tuner.command import prepare_spec
from autotune.tuner.driver import StudyDriver
from autotune.tuner.progress import Progress
from autotune.tuner.twin_cache import FOLDER

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)


def test_the_baseline_loads_when_its_server_is_ready_with_the_picks_ranked_by_then(autotune_run, sim_spec,
                                                                                  tmp_path: Path) -> None:
    # stream_interval: a knob the twin does not model (perfmodel/knobs.py), drawn for each pick
    space = {"params": {"gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95},
                        "max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True},
                        "stream_interval": {"type": "categorical", "choices": [1, 4, 16], "default": 1}}}
    spec = sim_spec("warm", confirm={"enabled": False}, warm_start={"from": "twin", "k": 2, "candidates": 6},
                    search_space=space)
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "40", "--no-progress"], tmp_path)
    # a pick starts once one is ranked: at the baseline's readiness from what was ranked by then, or
    # after it from the full ranking (a simulated server starts in 1-3 s, the workers in a few)
    run.wait_for(lambda ls: any(line.startswith("[trial") and "] warm_start:" in line for line in ls), 300)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(120) == 143
    lines = run.lines

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    ranking_starts, server_starts = first("twin (simulated) ranking 6 candidates"), first("starting ")
    settled, load_starts = first("warm start: "), first("capacity search by")
    # the ranking started before the server; the picks were taken when the server was ready, or when the
    # ranking was done if that came first (a ranking of 6 can end before the server's start is even
    # logged), and the load began after them, waiting for nothing
    assert ranking_starts < server_starts < load_starts and ranking_starts < settled < load_starts, "\n".join(lines)
    if "when the baseline's server was ready" in lines[settled]:
        assert server_starts < settled, "\n".join(lines)
    else:
        assert "when its ranking was done" in lines[settled], "\n".join(lines)
    assert not any("waiting for the twin" in line for line in lines)
    with sqlite3.connect(tmp_path / "warm.db") as conn:
        roles = [r for (r,) in conn.execute("select role from autotune_trials order by number")]
    assert roles[0] == "baseline" and "warm_start" in roles
    study = optuna.load_study(study_name="warm", storage=f"sqlite:///{tmp_path}/warm.db")
    for t in study.trials:
        if t.user_attrs.get("role") != "warm_start" or t.state == TrialState.WAITING:
            continue
        fixed = t.system_attrs.get("fixed_params") or {}
        # the twin fixed what it models; what it does not was drawn for the pick (inside the rules) and is
        # named so: the pick ran with a value of it that the twin did not choose
        assert "max_num_seqs" in fixed and "stream_interval" in fixed, t.system_attrs
        assert t.user_attrs["twin_drawn"] == ["stream_interval"] and "stream_interval" in t.params


def _driver(tmp_path: Path, name: str) -> StudyDriver:
    raw: dict[str, Any] = {
        "name": name, "model": "llama-3.1-8b", "storage": f"sqlite:///{tmp_path}/twin.db",
        "engine": {"kind": "sim", "gpu": "H100", "num_gpus": 1, "time_scale": 50, "extra_flags": ["--max-model-len", "4096"]},
        "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True}}},
        "workload": {"kind": "random", "input_len": 256, "output_len": 32}, "slo": "ttft:p99<=1s",
        "load": {"requests_per_step": 24}, "telemetry": {"source": "sim"},
        "warm_start": {"from": "twin", "k": 2, "candidates": 6}, "budget": {"n_trials": 4}}
    driver = StudyDriver(**prepare_spec(raw, "spec", None), host="h1", progress=Progress(name, ["capacity_tps"], 4, live=False))
    driver.open()
    return driver


def _waiting_roles(driver: StudyDriver) -> list[str]:
    study = optuna.load_study(study_name=driver.spec.name, storage=driver.spec.storage_url)
    return [t.user_attrs["role"] for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]


def test_a_second_study_with_the_same_key_ranks_from_the_cache(tmp_path: Path) -> None:
    drivers: list[StudyDriver] = []
    try:     # a failure must not leave a driver's heartbeat thread running into the tests after this one
        first = _driver(tmp_path, "first")
        drivers.append(first)
        warm = first.warm
        assert warm is not None and warm.pool is not None and warm.pending()   # ranking in its processes
        assert warm.finished(240), "the twin's workers did not finish"
        assert not warm.pending() and _waiting_roles(first) == ["baseline", "warm_start", "warm_start"]
        files = list((tmp_path / FOLDER).glob("*.json"))
        assert len(files) == 1

        second = _driver(tmp_path, "second")                      # same model, GPU, workload, space, seed
        drivers.append(second)
        assert second.warm is not None and second.warm.pool is None  # no process started: all from the cache
        assert not second.warm.pending()                          # the picks are in before any launch
        assert _waiting_roles(second) == ["baseline", "warm_start", "warm_start"]
        assert [p.params for p in second.warm.picks] == [p.params for p in warm.picks]
    finally:
        for driver in drivers:
            driver.heartbeats.stop()
