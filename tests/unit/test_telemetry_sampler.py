"""The shared polling loop: pacing, shutdown without leaked threads, bounded memory, overhead."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.telemetry import TelemetryTarget, _poll
from autotune.telemetry._poll import PollingSampler, Probe
from autotune.telemetry._stats import RunningStats, SeriesBuffer, decimate
from autotune.telemetry.base import TelemetrySummary


class CountingProbe(Probe):
    source = "test"

    def __init__(self, fail_every: int = 0, clock: list[float] | None = None, read_s: float = 0.0) -> None:
        self.fail_every, self.clock, self.read_s = fail_every, clock, read_s    # clock: the sampler's, faked
        self.reads, self.opened, self.closed = 0, 0, 0

    def open(self) -> None:
        self.opened += 1

    def read(self, t: float) -> dict[str, Any] | None:
        self.reads += 1
        if self.clock is not None:
            self.clock[0] += self.read_s                    # a read that takes read_s on the sampler's clock
        if self.fail_every and self.reads % self.fail_every == 0:
            raise RuntimeError("driver hiccup")
        return {"t": t, "n": self.reads}

    def summarise(self, s: TelemetrySummary) -> None:
        s.cpu_pct_mean = float(self.reads)

    def close(self) -> None:
        self.closed += 1


def telemetry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("autotune-")]


def test_paces_at_hz_and_joins_its_thread(wait_until) -> None:
    probe = CountingProbe()
    s = PollingSampler(probe, TelemetryTarget(), hz=50.0)
    before = time.monotonic()
    s.start()
    assert len(telemetry_threads()) == 1
    wait_until(lambda: s.series.seen >= 20, what="20 samples")
    summary = s.stop()
    took = time.monotonic() - before
    assert telemetry_threads() == []
    assert summary.samples >= 20 and probe.opened == probe.closed == 1
    # never faster than 50 Hz: each read starts a whole period after the one before (a busy machine can
    # only make the gaps longer)
    ts = [r["t"] for r in summary.series]
    assert len(ts) == summary.samples and all(b - a >= 0.02 - 1e-4 for a, b in zip(ts, ts[1:]))
    assert ts[-1] - 0.001 <= summary.duration_s <= took + 0.001      # the window holds every sample


def test_stop_is_prompt_at_low_rate_and_idempotent(wait_until) -> None:
    s = PollingSampler(CountingProbe(), TelemetryTarget(), hz=0.2)      # one sample per 5 s
    s.start()
    wait_until(lambda: s.series.seen >= 1, what="the first sample")
    t = time.monotonic()
    first = s.stop()
    assert time.monotonic() - t < 2.5                      # the wait is interruptible: not the rest of 5 s
    assert s.stop() is first and first.samples == 1
    assert first.series[0]["t"] < 2.5                      # the first sample at once, not after a period
    with pytest.raises(RuntimeError):
        s.start()                                          # one window per sampler


def test_stop_without_start_gives_an_empty_summary() -> None:
    probe = CountingProbe()
    summary = PollingSampler(probe, TelemetryTarget(), hz=10).stop()
    assert summary.samples == 0 and summary.series == [] and probe.reads == 0


def test_probe_errors_are_recorded_not_raised(wait_until) -> None:
    s = PollingSampler(CountingProbe(fail_every=2), TelemetryTarget(), hz=100)
    s.start()
    wait_until(lambda: s.series.seen > 3, what="four samples")
    summary = s.stop()
    assert summary.samples > 3 and "driver hiccup" in (summary.note or "")
    assert telemetry_threads() == []


def test_overhead_per_sample_is_the_read_time(monkeypatch: pytest.MonkeyPatch, wait_until) -> None:
    # the sampler's clock moves only while the probe reads (4 ms a read), so the overhead it reports is
    # the reads' time exactly, however busy the machine (the real waits between reads are not counted)
    clock = [100.0]
    monkeypatch.setattr(_poll, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    s = PollingSampler(CountingProbe(clock=clock, read_s=0.004), TelemetryTarget(), hz=50)
    s.start()
    wait_until(lambda: s.series.seen >= 5, what="five samples")
    summary = s.stop()
    assert summary.overhead_ms_per_sample == pytest.approx(4.0)
    assert summary.duration_s == pytest.approx(0.004 * summary.samples)


def test_series_memory_is_bounded_and_spans_the_whole_run() -> None:
    buf = SeriesBuffer(capacity=64)
    for i in range(100_000):
        buf.append({"t": float(i)})
    assert len(buf.rows) < 64 and buf.seen == 100_000
    ts = [r["t"] for r in buf.rows]
    assert ts[0] == 0.0 and ts[-1] > 90_000                # still covers start to (nearly) end
    gaps = {b - a for a, b in zip(ts, ts[1:])}
    assert len(gaps) == 1                                  # evenly spaced


def test_decimate_keeps_ends() -> None:
    rows = [{"t": i} for i in range(10_001)]
    out = decimate(rows, 2000)
    assert len(out) == 2000 and out[0]["t"] == 0 and out[-1]["t"] == 10_000
    assert decimate(rows[:5], 2000) == rows[:5]


def test_running_stats_skip_unread_values() -> None:
    st = RunningStats()
    for v in (1.0, None, 3.0):
        st.add("x", v)
    assert (st.count("x"), st.mean("x"), st.max("x"), st.min("x")) == (2, 2.0, 3.0, 1.0)
    assert st.mean("missing") is None
