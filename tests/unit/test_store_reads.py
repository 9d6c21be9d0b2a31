"""The store's narrow reads (`trial_times`, `trials_between`, `brackets`) give the code that uses them on
every ask, tell and scrape what a whole-row read gave it, on SQLite and on PostgreSQL: the time window and
the JSON path are the database's work there, so each dialect is checked."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy.orm.exc import DetachedInstanceError

from autotune import causes
from autotune.store.repository import ResultStore
from autotune.tuner.driver import expected_trial_s
from autotune.tuner.sharing import missed_by, overlapping

T0 = dt.datetime(2026, 12, 3, 9, 0, 0)
LEASE = {"slots": [0], "gpus": [], "cores": [0], "port": 8100}
STEPS = [{"load": n, "met": n < 30, "tps": 40.0 * n} for n in range(1, 40)]   # the bulk a full read decodes

# number, state, cause, start s, finish s, leased, overlapped, bracket
ROWS = [(0, "ok", None, 0, 10, True, [], [35.0, 40.0]),
        (1, "ok", None, 2, 12, True, [2, 3], [39.0, 41.0]),
        (2, "failed", causes.CRASH, 0, 4, True, [1], None),
        (3, "running", None, 8, None, True, None, None),
        (4, "stopped", None, 9, 11, True, [], [10.0, 12.0]),        # early-stopped: its bracket is no capacity
        (5, "failed", causes.CONSTRAINT, 9, 9.1, False, None, None),  # rejected before launch
        (6, "ok", None, 13, 30, True, [], [40.0, None]),
        (7, "running", None, 31, None, False, None, None)]             # asked, waiting for a slot


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _filled(url: str) -> tuple[ResultStore, int]:
    store = ResultStore(url)
    study = store.ensure_study(
        name="s", model="m", engine_kind="sim", engine_command=[], fixed_flags=[], space_hash="h", spec_hash="x",
        spec={}, objectives=[["capacity_tps", "maximize"]], slo="ttft:p99<=1s", quality_knobs=[])
    for n, state, cause, start, end, leased, overlapped, bracket in ROWS:
        store.save_trial(study.id, n, optuna_trial_id=n, state=state, cause=cause, params={"max_num_seqs": n},
                         flags=[], spec_hash="x", started_at=_at(start),
                         finished_at=None if end is None else _at(end), lease=LEASE if leased else None,
                         overlapped=overlapped, measurement_flags=["overlapped"] if overlapped else [],
                         capacity=None if bracket is None else {"bracket": bracket, "steps": STEPS},
                         client={"cpu_s": 1.5 + n, "cpu_share": 0.25} if state == "ok" else None,
                         log_tail="x" * 2000)
    return store, study.id


def _same_as_full_reads(url: str) -> None:
    store, sid = _filled(url)
    full = store.trials(sid)
    for number, start, end in [(3, 8, 15), (6, 13, 30), (1, 2, 12), (7, 31, 40), (4, 9, 11)]:
        narrow = store.trials_between(sid, _at(start), _at(end))
        mine = overlapping(full, number, _at(start), _at(end))
        assert overlapping(narrow, number, _at(start), _at(end)) == mine
        assert missed_by(narrow, number, mine) == missed_by(full, number, mine)
        assert {r.number: r.measurement_flags for r in narrow} == \
            {r.number: r.measurement_flags for r in full if r.number in {x.number for x in narrow}}
    assert [r.number for r in store.trials_between(sid, _at(8), _at(15))] == [0, 1, 3, 4, 5, 6]
    assert overlapping(full, 3, _at(8), _at(15)) == [0, 1, 4, 6]
    with pytest.raises(DetachedInstanceError):     # only the overlap's columns are read
        _ = store.trials_between(sid, _at(8), _at(15))[0].capacity

    assert store.brackets(sid) == [(r.capacity or {}).get("bracket") for r in full if r.state == "ok"]
    assert store.brackets(sid) == [[35.0, 40.0], [39.0, 41.0], [40.0, None]]

    times = store.trial_times(sid)
    assert [(t.number, t.state, t.cause, t.started_at, t.finished_at, t.client) for t in times] == \
        [(r.number, r.state, r.cause, r.started_at, r.finished_at, r.client) for r in full]
    assert expected_trial_s(times) == expected_trial_s(full) == 10.0


def test_narrow_reads_match_full_reads_on_sqlite(tmp_path: Path) -> None:
    _same_as_full_reads(f"sqlite:///{tmp_path / 's.db'}")


def test_narrow_reads_match_full_reads_on_postgres(postgres_url: str) -> None:
    _same_as_full_reads(postgres_url)
