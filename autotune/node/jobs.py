"""What the node's scheduler runs and whom it asks: a `Job` (which GPUs, alone or not) and a `JobSource`
(a study's driver: it hands out jobs, runs them in a job thread, and is told how they ended).

The scheduler knows jobs, not studies: it never imports the tuner. `tuner.driver.StudyDriver` is the
source `run` and `daemon` give it; tests give it stand-ins with the same methods. The protocols here are
the whole contract (docs/SCHEDULER.md, "The node layer").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from autotune.node.pool import Lease

AFTER_BUDGET = "after-budget"    # the role of a study's after-budget jobs (no Optuna trial behind them)

Phase = Callable[[str], None]


class Job(Protocol):
    """One thing that occupies GPUs: a trial (tuner.driver.TrialJob) or an after-budget job."""

    study: str
    number: int          # the Optuna trial number; < 0 for a job without a trial
    role: str
    n_gpus: int
    exclusive: bool      # nothing else may run on the node beside it


@dataclass
class NodeJob:
    """A job the scheduler makes itself: a study's after-budget work (a confirmation round, the report)."""

    study: str
    number: int
    role: str = AFTER_BUDGET
    n_gpus: int = 1
    exclusive: bool = False


class Reporter(Protocol):
    def phase(self, text: str) -> None: ...

    def message(self, text: str) -> None: ...


class JobSource(Protocol):
    """A study as the scheduler sees it. `next_job`, `finish`, `fail`, `interrupt` may be called from
    several threads; `run_job` and `run_after_budget` run in a job thread behind its gate."""

    name: str
    n_trials: int
    deadline: float | None           # --timeout, on time.monotonic()
    stop_reason: str | None
    cancelled: bool
    tag_phases: bool                 # prefix phase lines with the trial (set when trials overlap)
    exclusive: bool
    after_budget_started: bool       # the scheduler took an after-budget job of it
    after_budget_finished: bool      # its after-budget work ended for good
    progress: Reporter

    def open(self) -> None: ...

    def recover(self) -> None: ...

    def wants_trial(self) -> bool: ...

    def next_job(self) -> Job | None: ...

    def phase_for(self, job: Job) -> Phase: ...

    def run_job(self, job: Job, lease: Lease, phase: Phase) -> Any: ...

    def finish(self, job: Job, lease: Lease | None, outcome: Any) -> None: ...

    def fail(self, job: Job, cause: str, detail: str) -> None: ...

    def interrupt(self, job: Job, reason: str) -> None: ...

    def still_ours(self, job: Job) -> bool: ...

    def done(self) -> bool: ...

    def after_budget_due(self) -> bool: ...

    def after_budget_gpus(self) -> int: ...

    def run_after_budget(self, lease: Lease, phase: Phase) -> None: ...

    def close(self) -> Any: ...


__all__ = ["AFTER_BUDGET", "Job", "JobSource", "NodeJob", "Phase", "Reporter"]
