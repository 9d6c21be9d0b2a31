"""Which trial an export, the report and the deploy kit stand for. One function, so every output names
the same trial under the same rule (tuner/winner.export_choice: the confirmation's verdict, else the
best feasible trial without a measurement flag), or the trial the user names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from autotune.errors import UserError
from autotune.report.confirmed import export_header
from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.store.queries import is_feasible
from autotune.tuner.verdict import summarize_confirmations
from autotune.tuner.winner import ExportChoice, export_choice, unconfirmed_flagged


@dataclass
class ExportPick:
    trial: TrialRecord | None          # None: nothing may be exported (reason says why)
    warnings: list[str] = field(default_factory=list)
    reason: str = ""                   # why this trial (or why none), one line
    header: list[str] = field(default_factory=list)   # the verdict, as lines at the head of every export


def exported_trial(study: StudyRecord, trials: Sequence[TrialRecord], rows: Sequence[ConfirmationRecord] = (),
                   number: int | None = None, accept_flagged: bool = False,
                   output_preserving: bool = False) -> ExportPick:
    """The trial `export` writes: `number` when given (a measured trial, possibly infeasible, with a
    warning; refused when it carries a measurement flag and is not confirmed, unless the user accepts
    that in so many words), else the rule's choice (`output_preserving`: among the configurations that
    keep vLLM's output)."""
    if number is not None and output_preserving:
        raise UserError("--output-preserving chooses the trial: give it or --trial, not both")
    if number is not None:
        trial = next((t for t in trials if t.number == number), None)
        if trial is None:
            raise UserError(f"study {study.name!r} has no trial {number}")
        if not trial.objectives and trial.state != "ok":
            raise UserError(f"trial {number} did not run to a measurement ({trial.state}: {trial.cause})")
        refused = unconfirmed_flagged(trial, rows, study, trials)
        if refused and not accept_flagged:
            return ExportPick(None, [], refused + " (or accept that with --accept-flagged)")
        warnings = [] if is_feasible(trial) else [f"trial {trial.number} is not feasible ({trial.state})"]
        if refused:
            warnings.append(refused.split(": run")[0] + ": exported anyway (--accept-flagged)")
        choice = ExportChoice(trial, None, f"trial {trial.number} chosen with --trial")
    else:
        choice = export_choice(study, trials, rows, output_preserving=output_preserving)
        if choice.trial is None:
            return ExportPick(None, [], f"nothing to export from study {study.name!r}: {choice.why}")
        warnings = []
    header = export_header(study, trials, summarize_confirmations(study, trials, rows), choice)
    header += [f"WARNING: {w}" for w in warnings]
    return ExportPick(choice.trial, warnings, choice.why, header)
