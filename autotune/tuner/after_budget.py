"""The steps a study runs once it has its trials, shared by `run` and `daemon`: the confirmation of the
winners against the baseline (issue 11), and the daemon's report.

They run as jobs of the scheduler (node/scheduler.py): in job threads that hold leases, so a
confirmation's fresh servers take GPUs the pool gave it (other studies keep scheduling beside it), and
SIGINT/SIGTERM/--timeout/the daemon's drain interrupt them through the threads' gates like trials. The
confirmation is one job per round (tuner/budget.py): with free slots its rounds run at the same time on
different GPUs, each round's pair on one lease. The repeats already stored are kept: the next `run` (or
daemon) continues the confirmation.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from autotune.node.pool import Lease
from autotune.tuner.budget import BudgetPart, BudgetStep
from autotune.tuner.driver import StudyDriver, expected_trial_s, layout_gpus
from autotune.tuner.trial import Phase

log = logging.getLogger(__name__)


def confirm_parts(driver: StudyDriver) -> list[BudgetPart]:
    """One job per round with repeats still missing, each leasing the largest layout among the trials the
    round repeats. A round cut by --timeout sets the driver's stop reason (the exit message says to run
    again, and no further round starts). A round refused whole (too long for the time left) lets the later
    rounds try, since a shorter one may fit (confirm.Refusals); the last round to end then sets the stop
    reason. An interrupt propagates."""
    from autotune.tuner.confirm import (Refusals, plan_rounds, round_need_s, rounds_said, run_round,
                                        stopped_line)

    spec = driver.spec
    rounds = plan_rounds(spec, driver.store, driver.record, top_k=spec.confirm.top_k, repeats=spec.confirm.repeats,
                         say=driver.progress.message, max_extra=spec.confirm.max_extra)
    repeats = rounds_said(rounds, spec.confirm.repeats)
    started: set[int] = set()
    ended: set[int] = set()
    refused = Refusals()
    lock = threading.Lock()

    def stop(left: int, reason: str) -> None:
        driver.progress.message(stopped_line(left))
        driver.stop_reason = driver.stop_reason or reason

    def part(rnd_index: int) -> Callable[[Lease, Phase], None]:
        rnd = rounds[rnd_index]

        def run(lease: Lease, phase: Phase) -> None:
            expected = expected_trial_s(driver.store.trial_times(driver.record.id)) or 0.0
            with lock:
                started.add(rnd.number)
                hopeless = refused.hopeless(rnd, driver.store.confirmations(driver.record.id), expected)
            if hopeless:
                result = None
            else:
                tagged = ((lambda text: phase(f"[round {rnd.number + 1}/{repeats}] {text}")) if driver.tag_phases
                          else phase)
                result = run_round(spec, driver.store, driver.record, driver.runner, rnd, repeats=repeats,
                                   phase=tagged, say=driver.progress.message, deadline=driver.deadline, lease=lease,
                                   expected_s=expected, budget_s=driver.timeout_s)
            with lock:
                ended.add(rnd.number)
                if result is None or result.refused:
                    refused.add(rnd, None if result is None else
                                round_need_s(rnd, driver.store.confirmations(driver.record.id), expected))
                elif result.stopped_by:
                    left = result.pending + refused.pending() + sum(len(r.repeats) for r in rounds
                                                                    if r.number not in started)
                    stop(left, result.stopped_by)
                    return
                if refused.rounds and len(ended) == len(rounds):
                    stop(refused.pending(), "timeout")
        return run

    return [BudgetPart(f"confirm round {rnd.number + 1}",
                       max(layout_gpus([*driver.fixed_flags, *t.flags]) for _, t in rnd.repeats), part(i))
            for i, rnd in enumerate(rounds)]


def report_step(path: Path, say: Callable[[str], None]) -> BudgetStep:
    """Write the study's HTML report to `path` (the daemon: LOG_ROOT/HOST/STUDY/report.html). A report
    that cannot be written is said and logged, never fatal: the study's results are in the database."""

    def run(driver: StudyDriver, _lease: Lease, _phase: Phase) -> None:
        from autotune.report.html import write_report

        try:
            written = write_report(driver.spec.storage_url, driver.spec.name, str(path))
        except Exception as exc:    # a report is a view of stored results: never worth a study
            log.warning("report of %s not written: %s", driver.name, exc, exc_info=True)
            say(f"{driver.name}: report not written ({type(exc).__name__}: {exc})")
            return
        say(f"{driver.name}: report {written}")

    return BudgetStep("report", run)


def register(driver: StudyDriver, *, report: Path | None = None, say: Callable[[str], None] | None = None) -> None:
    """The after-budget steps of a study: the confirmation when the spec enables it, then the report
    (when a path is given: the daemon's)."""
    if driver.spec.confirm.enabled:
        driver.after_budget.append(BudgetStep("confirm", parts=confirm_parts))
    if report is not None:
        driver.after_budget.append(report_step(report, say or driver.progress.message))


__all__ = ["confirm_parts", "register", "report_step"]
