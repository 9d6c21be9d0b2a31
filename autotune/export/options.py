"""What an export may need beyond the trial: the store (for confirmations), the user's image and engine
command choices. One small object so that every format has the same signature."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.report import confirmed as conf
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.repository import ResultStore
from autotune.tuner.verdict import flags_of, quality_changes


@dataclass
class ExportContext:
    store: ResultStore
    study: StudyRecord
    trials: list[TrialRecord]
    trial: TrialRecord
    image: str | None = None                 # docker/k8s image override
    engine_cmd: list[str] | None = None      # deploy-kit engine command override
    warnings: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)   # the verdict lines (export/choice.py) every format carries

    @property
    def baseline(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.role == "baseline"), None)

    def verdict(self) -> str:
        return conf.verdict_line(self.trials, conf.by_trial(self.store, self.study, self.trials), self.trial.number)

    def confirmed(self) -> conf.Confirmed | None:
        return conf.by_trial(self.store, self.study, self.trials).get(self.trial.number)

    def quality(self) -> dict[str, Any]:
        """The quality knobs the trial sets to other than the baseline ran (empty: output-preserving)."""
        return quality_changes(self.study, self.trial, self.baseline)

    def measurement_flags(self) -> list[str]:
        return flags_of(self.trial)
