"""A study's after-budget work as jobs of the scheduler: steps in order (the confirmation, then the
daemon's report), each made of parts that may run at the same time on separate leases (the
confirmation's rounds, docs/SCHEDULER.md "Confirmation rounds are leased jobs").

The scheduler asks the driver `after_budget_due()` / `after_budget_gpus()` and runs
`run_after_budget(lease, phase)` in a job thread per part; `AfterBudget` is what answers behind those:
a step's parts are listed when the step begins (from what the database holds then), the next step
begins once every part of this one has ended, and the work is finished when the last part of the last
step has. A part that is interrupted leaves its stored rows; the next run lists what is still missing.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from autotune.node.pool import Lease

Phase = Callable[[str], None]


class _Driver(Protocol):
    """What of tuner.driver.StudyDriver the after-budget work uses (it also hands itself to the steps)."""

    after_budget: list["BudgetStep"]
    after_budget_finished: bool

    def usual_gpus(self) -> int: ...


@dataclass
class BudgetPart:
    """One job of a step: `run(lease, phase)` in a job thread holding `n_gpus` GPUs."""

    name: str
    n_gpus: int
    run: Callable[[Lease, Phase], None]


@dataclass
class BudgetStep:
    """One after-budget step. `run(driver, lease, phase)` runs in the scheduler's job thread with the
    job's lease (a confirmation's servers take its GPUs, ports and cores); `n_gpus(driver)`, when given,
    is how many GPUs it needs (the largest layout it will launch). A step with `parts` is split instead:
    `parts(driver)` lists jobs that may run at once, each on its own lease (`run` is then not used)."""

    name: str
    run: Callable[[Any, Lease, Phase], None] | None = None      # (driver, lease, phase)
    n_gpus: Callable[[Any], int] | None = None                  # (driver) -> GPUs
    parts: Callable[[Any], list[BudgetPart]] | None = None      # (driver) -> jobs that may run at once

    def split(self, driver: _Driver) -> list[BudgetPart]:
        if self.parts is not None:
            return self.parts(driver)
        assert self.run is not None, f"after-budget step {self.name} has neither run nor parts"
        run = self.run
        n = self.n_gpus(driver) if self.n_gpus is not None else driver.usual_gpus()
        return [BudgetPart(self.name, n, lambda lease, phase: run(driver, lease, phase))]


class AfterBudget:
    """The driver's after-budget work in progress (thread-safe: the scheduler's loop asks, job threads run)."""

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self._lock = threading.Lock()
        self._step = -1                      # index of the step whose parts are handed out
        self._pending: deque[BudgetPart] = deque()
        self._running = 0

    def ready(self) -> bool:
        """A part may start now (begins the next step when this one's parts have all ended)."""
        with self._lock:
            while not self._pending and self._running == 0 and self._step + 1 < len(self.driver.after_budget):
                self._step += 1
                self._pending.extend(self.driver.after_budget[self._step].split(self.driver))
            if not self._pending and self._running == 0 and self._step + 1 >= len(self.driver.after_budget):
                self.driver.after_budget_finished = True
            return bool(self._pending)

    def next_gpus(self) -> int:
        with self._lock:
            return self._pending[0].n_gpus if self._pending else self.driver.usual_gpus()

    def run_next(self, lease: Lease, phase: Phase) -> None:
        """Job thread: run the next part. Interrupted and errors propagate (the scheduler records them)."""
        with self._lock:
            if not self._pending:
                return
            part = self._pending.popleft()
            self._running += 1
        try:
            part.run(lease, phase)
        finally:
            with self._lock:
                self._running -= 1
        self.ready()                         # the last part of the last step: finished


__all__ = ["AfterBudget", "BudgetPart", "BudgetStep"]
