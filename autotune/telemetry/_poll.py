"""The one background-sampling loop every source shares.

A source supplies a `Probe` (open, read one sample, summarise, close); this module owns the thread,
its pacing, shutdown, the bounded series and the overhead measurement, so those are written (and
tested) once. The vLLM `/metrics` scrape runs beside it in its own thread.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from autotune.errors import UserError
from autotune.telemetry._stats import SeriesBuffer
from autotune.telemetry.base import Sampler, TelemetrySummary, TelemetryTarget
from autotune.telemetry.metrics import MetricsScraper


class Probe(ABC):
    """Reads one source. `read` runs on the sampler thread only; `open`/`close` on the caller's."""

    source: str = "?"

    def open(self) -> None:
        """Acquire handles; raise here (on the caller's thread) when the source cannot be read."""

    @abstractmethod
    def read(self, t: float) -> dict[str, Any] | None:
        """One sample at `t` seconds since start, as a flat series row (None: nothing read this time)."""

    @abstractmethod
    def summarise(self, summary: TelemetrySummary) -> None:
        """Fill the source's fields of `summary` from everything read so far."""

    def close(self) -> None:
        """Release handles; must not raise."""


class PollingSampler(Sampler):
    """Calls `probe.read` at `hz` on a daemon thread until `stop()`, which joins it and summarises."""

    def __init__(self, probe: Probe, target: TelemetryTarget, hz: float = 10.0,
                 metrics_hz: float = 2.0, series_capacity: int = 4096,
                 scraper: MetricsScraper | None = None) -> None:
        if not hz > 0:
            raise UserError(f"telemetry hz must be positive, got {hz}")
        self.probe = probe
        self.target = target
        self.period = 1.0 / hz
        self.series = SeriesBuffer(series_capacity)
        if scraper is None and target.server_url and metrics_hz > 0:
            scraper = MetricsScraper(target.server_url, hz=metrics_hz)
        self.scraper = scraper
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t_end = 0.0
        self._read_s = 0.0
        self._reads = 0
        self._summary: TelemetrySummary | None = None
        self.error: str | None = None
        self.started_at: float | None = None   # time.monotonic() of t=0 in the series

    def start(self) -> None:
        if self._thread is not None or self._summary is not None:
            raise RuntimeError("a sampler runs once; make a new one per load step")
        self.probe.open()
        self._t0 = time.monotonic()
        self.started_at = self._t0
        self._thread = threading.Thread(target=self._run, name=f"autotune-telemetry-{self.probe.source}",
                                        daemon=True)
        self._thread.start()
        if self.scraper is not None:
            self.scraper.start(self._t0)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                row = self.probe.read(started - self._t0)
            except Exception as exc:  # a dying server or driver must not kill the trial
                self.error = f"{type(exc).__name__}: {exc}"
                row = None
            took = time.monotonic() - started
            self._read_s += took
            self._reads += 1
            if row is not None:
                self.series.append(row)
            self._stop.wait(max(0.0, self.period - took))

    def stop(self) -> TelemetrySummary:
        if self._summary is not None:
            return self._summary
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._t_end = time.monotonic()
        if self.scraper is not None:
            self.scraper.stop()
        self.probe.close()
        s = TelemetrySummary(source=self.probe.source)
        s.samples = self.series.seen
        s.duration_s = round(self._t_end - self._t0, 3) if self._t0 else 0.0
        if self._reads:
            s.overhead_ms_per_sample = round(1000.0 * self._read_s / self._reads, 3)
        self.probe.summarise(s)
        if self.scraper is not None:
            self.scraper.fill(s)
        rows = list(self.series.rows)
        if self.scraper is not None:
            rows = sorted(rows + self.scraper.series.rows, key=lambda r: r.get("t", 0.0))
        s.series = rows
        if self.error and not s.note:
            s.note = f"sampling error: {self.error}"
        self._summary = s
        return s
