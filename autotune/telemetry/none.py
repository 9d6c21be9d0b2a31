"""`none`: telemetry switched off; the summary says so instead of looking like an idle machine."""

from __future__ import annotations

from autotune.telemetry.base import Sampler, TelemetrySource, TelemetrySummary, TelemetryTarget


class NoneSampler(Sampler):
    def __init__(self, note: str) -> None:
        self.note = note

    def start(self) -> None:
        pass

    def stop(self) -> TelemetrySummary:
        return TelemetrySummary(source="none", note=self.note)


class NoneSource(TelemetrySource):
    name = "none"

    def __init__(self, note: str = "telemetry off: nothing measured") -> None:
        self.note = note

    def sampler(self, target: TelemetryTarget, hz: float = 10.0) -> Sampler:
        return NoneSampler(self.note)
