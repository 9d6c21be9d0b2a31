"""Where the single-trial study loop used to live. The loop is now `tuner/driver.py` (one study's
ask / tell / evidence) behind `daemon/scheduler.py` (leases, worker threads, interrupts): `run` and
`daemon` are the same path. These names stay importable from here for code written against the loop.

Interrupts are part of the design, not an afterthought: Ctrl-C, SIGTERM and the invocation's own
timeout stop the running trials' servers, mark the trials FAIL (not counted) and enqueue their
parameters again, so the next `autotune run` redoes exactly those candidates.
"""

from __future__ import annotations

from autotune.tuner.driver import StudyResult, expected_trial_s, log_dir_for
from autotune.tuner.sharing import make_sampler
from autotune.tuner.interrupts import Interrupted, _interrupts

__all__ = ["Interrupted", "StudyResult", "_interrupts", "expected_trial_s", "log_dir_for", "make_sampler"]
