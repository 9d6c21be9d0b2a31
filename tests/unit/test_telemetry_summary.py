"""Objectives, the headroom constraint, storage round trip and the one-line summary."""

from __future__ import annotations

import json

import pytest

from autotune.telemetry import (TelemetrySummary, format_summary, headroom_violation, objectives,
                                series_for_store, summary_for_store, summary_from_store)


def gpu_summary(**kw: object) -> TelemetrySummary:
    base = dict(source="nvml", samples=300, duration_s=30.0, mean_power_w=312.0, max_power_w=690.0,
                energy_j=9000.0, energy_window_s=30.0, energy_method="counter", peak_mem_used_mib=22_733.0,
                mem_total_mib=143_771.0, mean_util_pct=80.0, peak_kv_usage_pct=63.2, preemptions=12.0,
                gpus=[0, 1])
    base.update(kw)
    return TelemetrySummary(**base)  # type: ignore[arg-type]


def test_objectives_use_the_energy_rate() -> None:
    s = gpu_summary()
    obj = objectives(s, output_tokens=18_000, duration_s=30.0, num_gpus=2, output_tps=600.0)
    assert obj["tps_per_gpu"] == 300.0
    assert obj["tokens_per_joule"] == pytest.approx(600.0 / 300.0)        # 9000 J / 30 s = 300 W
    assert obj["mem_headroom"] == pytest.approx(1 - 22_733 / 143_771)
    assert s.joules_per_token == pytest.approx(0.5)


def test_objectives_fall_back_to_mean_power_then_leave_energy_out() -> None:
    s = gpu_summary(energy_j=None, energy_window_s=None)
    assert objectives(s, 1000, 10.0, 1, 0.0)["tokens_per_joule"] == pytest.approx(100.0 / 312.0)
    cpu = TelemetrySummary(source="cpu", cpu_pct_mean=150.0, peak_mem_used_mib=3000.0, mem_total_mib=24_000.0)
    obj = objectives(cpu, 640, 8.0, 1, 80.0)
    assert set(obj) == {"tps_per_gpu", "mem_headroom"} and obj["mem_headroom"] == pytest.approx(0.875)
    assert set(objectives(TelemetrySummary(source="none"), 10, 1.0, 1, 10.0)) == {"tps_per_gpu"}


def test_headroom_violation_sign() -> None:
    nearly_full = gpu_summary(peak_mem_used_mib=140_000.0)                 # 2.6% free
    assert headroom_violation(nearly_full, 0.05) == pytest.approx(0.05 - (1 - 140_000 / 143_771))
    assert headroom_violation(nearly_full, 0.05) > 0                       # violated
    assert headroom_violation(gpu_summary(), 0.05) < 0                     # 84% free: fine
    assert headroom_violation(TelemetrySummary(source="none"), 0.05) is None


def test_store_round_trip_is_json_and_drops_the_series() -> None:
    s = gpu_summary(series=[{"t": i / 10, "power_w": 100.0 + i} for i in range(5000)])
    stored = json.loads(json.dumps(summary_for_store(s)))
    assert "series" not in stored and stored["peak_kv_usage_pct"] == 63.2
    back = summary_from_store({**stored, "field_from_the_future": 1})
    assert back.mem_headroom == s.mem_headroom and back.series == []
    series = series_for_store(s)
    assert len(series) == 2000 and series[0]["t"] == 0.0 and series[-1]["t"] == 499.9


def test_format_summary_reads_like_the_example() -> None:
    s = gpu_summary()
    objectives(s, 18_000, 30.0, 2, 600.0)
    line = format_summary(s)
    assert line == ("312 W mean / 690 W max, 2 tok/J, util 80%, peak 22.2 GiB of 140 (84% headroom), "
                    "KV 63% peak, 12 preemptions")
    assert format_summary(summary_for_store(s)) == line                  # works from the stored dict too


def test_format_summary_flags_low_headroom_and_marks_sources() -> None:
    s = gpu_summary(peak_mem_used_mib=140_000.0, throttle_reasons=["sw_power_cap"], simulated=True)
    line = format_summary(s, margin=0.05)
    assert "LOW HEADROOM (< 5% margin)" in line and "clocks held by sw_power_cap" in line
    assert line.endswith("simulated")
    assert "LOW HEADROOM" not in format_summary(gpu_summary(), margin=0.05)
    cpu = TelemetrySummary(source="cpu", cpu_pct_mean=183.4, peak_mem_used_mib=3276.8, rss_peak_mib=3276.8,
                           mem_total_mib=24_000.0)
    assert format_summary(cpu) == "CPU 183%, RSS peak 3.2 GiB of 23.4 (86% headroom)"
    assert format_summary(TelemetrySummary(source="none", note="telemetry off")) == "no telemetry (telemetry off)"
