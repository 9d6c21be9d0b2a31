"""Which trial an export, the report and the deploy kit stand for. One function, so that every output
names the same trial, and so that the confirmation work (issue 11) can replace the rule in one place:
today it is the best feasible trial on the first objective, or the trial the user names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from autotune.errors import UserError
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import best_trial, is_feasible


@dataclass
class ExportChoice:
    trial: TrialRecord | None          # None: nothing feasible to export
    warnings: list[str] = field(default_factory=list)
    reason: str = ""                   # why this trial (or why none), one line


def exported_trial(study: StudyRecord, trials: Sequence[TrialRecord], number: int | None = None) -> ExportChoice:
    """The trial `export` writes: `number` when given (a measured trial, possibly infeasible, with a
    warning), else the best feasible one."""
    if number is not None:
        trial = next((t for t in trials if t.number == number), None)
        if trial is None:
            raise UserError(f"study {study.name!r} has no trial {number}")
        if not trial.objectives and trial.state != "ok":
            raise UserError(f"trial {number} did not run to a measurement ({trial.state}: {trial.cause})")
        warnings = [] if is_feasible(trial) else [f"trial {trial.number} is not feasible ({trial.state})"]
        return ExportChoice(trial, warnings, f"trial {number} as asked")
    trial = best_trial(study, trials)
    if trial is None:
        return ExportChoice(None, [], f"no feasible trial in study {study.name!r} to export")
    return ExportChoice(trial, [], f"best feasible trial on {study.objectives[0][0]}")
