"""The steps a study runs once it has its trials, shared by `run` and `daemon`: the confirmation of the
winners against the baseline (issue 11), and the daemon's report.

They run as jobs of the scheduler (node/scheduler.py): in a worker thread that holds a lease, so a
confirmation's fresh servers take GPUs the pool gave it (other studies keep scheduling beside it), and
SIGINT/SIGTERM/--timeout/the daemon's drain interrupt it through the thread's gate like a trial. The
repeats already stored are kept: the next `run` (or daemon) continues the confirmation.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from autotune.node.pool import Lease
from autotune.tuner.driver import BudgetStep, StudyDriver, layout_gpus
from autotune.tuner.trial import Phase

log = logging.getLogger(__name__)


def confirm_gpus(driver: StudyDriver) -> int:
    """The largest layout among the trials the confirmation will repeat (the baseline and the picked
    candidates), else the study's usual one (nothing feasible: the step only says so)."""
    from autotune.store.queries import is_feasible
    from autotune.tuner.picks import pick_candidates

    trials = driver.store.trials(driver.record.id)
    baseline = [t for t in trials if t.role == "baseline" and is_feasible(t)][:1]
    conf = driver.spec.confirm
    repeated = baseline + pick_candidates(driver.record, trials, conf.top_k, conf.max_extra,
                                          driver.store.confirmations(driver.record.id)).candidates
    if not repeated:
        return driver.usual_gpus()
    return max(layout_gpus([*driver.fixed_flags, *t.flags]) for t in repeated)


def confirm_step(driver: StudyDriver, lease: Lease, phase: Phase) -> None:
    """Confirm the winners on fresh servers inside the job's lease. A confirmation cut by --timeout sets
    the driver's stop reason (the exit message says to run again); an interrupt propagates."""
    from autotune.tuner.confirm import confirm_study
    from autotune.tuner.driver import expected_trial_s

    spec = driver.spec
    result = confirm_study(spec, driver.store, driver.record, driver.runner, top_k=spec.confirm.top_k,
                           repeats=spec.confirm.repeats, max_extra=spec.confirm.max_extra, phase=phase,
                           say=driver.progress.message,
                           deadline=driver.deadline, lease=lease,
                           expected_s=expected_trial_s(driver.store.trials(driver.record.id)) or 0.0)
    if result.stopped_by:
        driver.stop_reason = result.stopped_by


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
        driver.after_budget.append(BudgetStep("confirm", confirm_step, confirm_gpus))
    if report is not None:
        driver.after_budget.append(report_step(report, say or driver.progress.message))


__all__ = ["confirm_gpus", "confirm_step", "register", "report_step"]
