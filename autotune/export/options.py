"""What an export may need beyond the trial: the store (for confirmations), the user's image and engine
command choices. One small object so that every format has the same signature."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.report import confirmed as conf
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.repository import ResultStore


@dataclass
class ExportContext:
    store: ResultStore
    study: StudyRecord
    trials: list[TrialRecord]
    trial: TrialRecord
    image: str | None = None                 # docker/k8s image override
    engine_cmd: list[str] | None = None      # deploy-kit engine command override
    warnings: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> TrialRecord | None:
        return next((t for t in self.trials if t.role == "baseline"), None)

    def verdict(self) -> str:
        confirms = conf.confirmations(self.store.engine, self.study)
        base = self.baseline
        return conf.verdict(self.study, confirms.get(base.number) if base else None, confirms.get(self.trial.number))

    def confirmed(self) -> conf.Confirmed | None:
        return conf.confirmations(self.store.engine, self.study).get(self.trial.number)

    def measurement_flags(self) -> list[str]:
        return conf.measurement_flags(self.store.engine, self.study).get(self.trial.number, [])
