"""The `overlapped` relation between trials: who counts as running, and that it stays mutual when one
trial finishes while another's start is being written."""
from __future__ import annotations

import datetime as dt

from autotune import causes
from autotune.store.models import TrialRecord
from autotune.tuner.sharing import missed_by, overlapping

T0 = dt.datetime(2026, 12, 3, 9, 0, 0)
LEASE = {"slots": [0], "gpus": [], "cores": [0], "port": 8100}


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _row(number: int, start: float | None, end: float | None, *, lease: dict | None = LEASE,
         cause: str | None = None, overlapped: list[int] | None = None) -> TrialRecord:
    return TrialRecord(number=number, started_at=None if start is None else _at(start),
                       finished_at=None if end is None else _at(end), lease=lease, cause=cause,
                       overlapped=overlapped)


def test_only_leased_trials_that_ran_in_the_window_count() -> None:
    rows = [_row(0, 0, 10),                      # finished inside the window
            _row(1, 5, None),                    # still running
            _row(2, 1, None, lease=None),        # asked, waiting for a slot: its start is the ask
            _row(3, 1, 2, lease=None, cause=causes.CONSTRAINT),   # rejected before launch
            _row(4, 30, None),                   # leased after the window's end
            _row(5, 0, 3),                       # finished before the window
            _row(6, 4, 20)]                      # ourselves
    assert overlapping(rows, 6, _at(4), _at(20)) == [0, 1]


def test_a_later_finisher_completes_the_earlier_ones_list() -> None:
    # Trial 0 finished at t=10 while trial 3's lease (t=8) was not yet written: 0 lists nothing. Trial 3
    # sees 0 finished after its start, lists it, and gets 0's list corrected; 1 already lists 3.
    rows = [_row(0, 0, 10, overlapped=[]), _row(1, 2, 12, overlapped=[2, 3]), _row(2, 0, 4, overlapped=[1]),
            _row(3, 8, None)]
    mine = overlapping(rows, 3, _at(8), _at(15))
    assert mine == [0, 1]
    assert missed_by(rows, 3, mine) == {0: [3]}
    # A trial still running is not corrected: it computes its own list when it finishes.
    rows = [_row(0, 0, None), _row(1, 2, 9)]
    assert missed_by(rows, 1, overlapping(rows, 1, _at(2), _at(9))) == {}
