"""What `status` says about a study, from the database alone: counts, best so far, expected finish."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from autotune.daemon.queue import StudyQueue
from autotune.daemon.status import render, study_rows
from autotune.store.repository import ResultStore

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def _store(tmp_path: Path, budget_s: float | None) -> tuple[ResultStore, StudyQueue]:
    url = f"sqlite:///{tmp_path / 's.db'}"
    queue = StudyQueue(url)
    queue.submit("s", {"name": "s", "engine": {"kind": "sim"}}, priority=2, n_trials=10, time_budget_s=budget_s)
    store = ResultStore(url)
    study = store.ensure_study(
        name="s", model="m", engine_kind="sim", engine_command=[], fixed_flags=[], space_hash="h", spec_hash="x",
        spec={}, objectives=[["capacity_tps", "maximize"]], slo="ttft:p99<=1s", quality_knobs=[])
    rows = [  # number, state, cause, seconds, capacity
        (0, "ok", None, 100, 50.0), (1, "ok", None, 120, 80.0), (2, "failed", "startup_oom", 40, None),
        (3, "failed", "constraint", 0, None), (4, "interrupted", "interrupted", 30, None),
        (5, "running", None, None, None), (6, "running", None, None, None)]
    for n, state, cause, secs, cap in rows:
        store.save_trial(study.id, n, optuna_trial_id=n, state=state, cause=cause, params={"max_num_seqs": n},
                         flags=[], spec_hash="x", objectives={"capacity_tps": cap} if cap else {},
                         constraints={"slo:ttft:p99": -1.0} if cap else {}, started_at=T0,
                         finished_at=None if secs is None else T0 + dt.timedelta(seconds=secs))
    return store, queue


def test_counts_best_and_expected_finish(tmp_path: Path) -> None:
    store, queue = _store(tmp_path, None)
    [row] = study_rows(store, queue.entries(), now=T0)
    assert (row["state"], row["complete"], row["running"], row["failed"], row["interrupted"]) == \
        ("running", 4, [5, 6], 2, 1)
    assert row["best"]["trial"] == 1 and row["best"]["objectives"] == {"capacity_tps": 80.0}
    # median over trials that launched a server (100, 120, 40 s) = 100 s; 6 to go, 2 at a time: 3 waves
    assert row["median_trial_s"] == 100.0
    assert row["expected_finish"] == (T0 + dt.timedelta(seconds=300)).isoformat(timespec="seconds")
    text = render({"studies": [row], "gpus": [{"slot": 0, "study": "s", "trial": 5, "phase": "load"}]})
    assert "s (SIMULATED): running, priority 2, 4/10 trials, running #5, #6" in text
    assert "best so far: trial #1 (capacity_tps 80)" in text and "gpu 0: s trial #5: load" in text


def test_expected_finish_never_past_the_time_budget(tmp_path: Path) -> None:
    store, queue = _store(tmp_path, budget_s=120)
    queue.tick("s", cap_s=100, now=1000.0)
    queue.tick("s", cap_s=100, now=1050.0)         # 50 of 120 s used
    [row] = study_rows(store, queue.entries(), now=T0)
    assert row["expected_finish"] == (T0 + dt.timedelta(seconds=70)).isoformat(timespec="seconds")
