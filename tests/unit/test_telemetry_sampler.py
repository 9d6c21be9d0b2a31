"""The shared polling loop: pacing, shutdown without leaked threads, bounded memory, overhead."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from autotune.telemetry import TelemetryTarget
from autotune.telemetry._poll import PollingSampler, Probe
from autotune.telemetry._stats import RunningStats, SeriesBuffer, decimate
from autotune.telemetry.base import TelemetrySummary


class CountingProbe(Probe):
    source = "test"

    def __init__(self, delay_s: float = 0.0, fail_every: int = 0) -> None:
        self.delay_s, self.fail_every = delay_s, fail_every
        self.reads, self.opened, self.closed = 0, 0, 0

    def open(self) -> None:
        self.opened += 1

    def read(self, t: float) -> dict[str, Any] | None:
        self.reads += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_every and self.reads % self.fail_every == 0:
            raise RuntimeError("driver hiccup")
        return {"t": t, "n": self.reads}

    def summarise(self, s: TelemetrySummary) -> None:
        s.cpu_pct_mean = float(self.reads)

    def close(self) -> None:
        self.closed += 1


def telemetry_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("autotune-")]


def test_paces_at_hz_and_joins_its_thread() -> None:
    probe = CountingProbe()
    s = PollingSampler(probe, TelemetryTarget(), hz=50.0)
    s.start()
    assert len(telemetry_threads()) == 1
    time.sleep(0.5)
    summary = s.stop()
    assert telemetry_threads() == []
    assert 18 <= summary.samples <= 27                     # 50 Hz x 0.5 s, with scheduling slack
    assert probe.opened == probe.closed == 1
    assert summary.duration_s == pytest.approx(0.5, abs=0.1)
    assert summary.series[0]["t"] < 0.01 and summary.series[-1]["t"] > 0.4


def test_stop_is_prompt_at_low_rate_and_idempotent() -> None:
    s = PollingSampler(CountingProbe(), TelemetryTarget(), hz=0.2)      # one sample per 5 s
    s.start()
    time.sleep(0.05)
    t = time.monotonic()
    first = s.stop()
    assert time.monotonic() - t < 0.5                      # the wait is interruptible, not a sleep
    assert s.stop() is first and first.samples == 1
    with pytest.raises(RuntimeError):
        s.start()                                          # one window per sampler


def test_stop_without_start_gives_an_empty_summary() -> None:
    probe = CountingProbe()
    summary = PollingSampler(probe, TelemetryTarget(), hz=10).stop()
    assert summary.samples == 0 and summary.series == [] and probe.reads == 0


def test_probe_errors_are_recorded_not_raised() -> None:
    s = PollingSampler(CountingProbe(fail_every=2), TelemetryTarget(), hz=100)
    s.start()
    time.sleep(0.2)
    summary = s.stop()
    assert summary.samples > 3 and "driver hiccup" in (summary.note or "")
    assert telemetry_threads() == []


def test_overhead_per_sample_is_the_read_time() -> None:
    s = PollingSampler(CountingProbe(delay_s=0.004), TelemetryTarget(), hz=50)
    s.start()
    time.sleep(0.3)
    summary = s.stop()
    assert 4.0 <= summary.overhead_ms_per_sample < 8.0


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
