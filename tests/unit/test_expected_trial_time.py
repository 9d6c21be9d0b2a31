"""How long the next trial is expected to take, which decides whether a run with --timeout starts it."""

import datetime as dt
from types import SimpleNamespace

from autotune import causes
from autotune.tuner.driver import expected_trial_s

T0 = dt.datetime(2026, 11, 29, 12, 0, 0)


def rec(state: str, seconds: float | None, cause: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(state=state, cause=cause, started_at=T0,
                           finished_at=None if seconds is None else T0 + dt.timedelta(seconds=seconds))


def test_median_of_launched_trials() -> None:
    records = [rec("ok", 150), rec("ok", 170), rec("failed", 40, causes.STARTUP_OOM), rec("ok", 160)]
    assert expected_trial_s(records) == 155.0   # median of 40, 150, 160, 170


def test_rejected_interrupted_and_running_trials_do_not_count() -> None:
    records = [rec("ok", 120), rec("failed", 0.01, causes.CONSTRAINT), rec("failed", 0.02, causes.PREDICTED_OOM),
               rec("interrupted", 77, causes.INTERRUPTED), rec("running", None)]
    assert expected_trial_s(records) == 120.0


def test_no_history_means_no_estimate() -> None:
    assert expected_trial_s([]) is None
    assert expected_trial_s([rec("failed", 0.0, causes.CONSTRAINT)]) is None
