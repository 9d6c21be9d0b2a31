"""The real NVML reading on an H200 (benchmarks/telemetry_nvml_h200.py, recorded in
tests/fixtures/telemetry_nvml_h200.json) shows what the source must show: power follows load, memory
used follows what the load allocated, the energy counter agrees with the power samples, and 10 Hz
sampling costs little."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.telemetry import format_summary, summary_from_store

FIXTURE = Path(__file__).parents[1] / "fixtures" / "telemetry_nvml_h200.json"


@pytest.fixture(scope="module")
def rec() -> dict:
    return json.loads(FIXTURE.read_text())


def test_it_is_a_real_h200_reading(rec: dict) -> None:
    assert rec["meta"]["mock"] is False and "H200" in rec["meta"]["nvml_name"]
    s = rec["summary"]
    assert s["source"] == "nvml" and s["unsupported"] == [] and s["energy_method"] == "counter"
    assert FIXTURE.stat().st_size < 500_000


def test_power_rises_with_load_and_falls_after(rec: dict) -> None:
    idle, load, after = (rec["phases"][k] for k in ("idle_before", "load", "idle_after"))
    assert load["mean_power_w"] > 3 * idle["mean_power_w"]
    assert load["mean_power_w"] > 0.85 * rec["meta"]["power_limit_w"]          # a matmul loop runs at the cap
    assert after["mean_power_w"] < 0.5 * load["mean_power_w"]
    assert load["mean_util_pct"] > 95 and idle["mean_util_pct"] < 5
    assert "sw_power_cap" in rec["summary"]["throttle_reasons"]
    # the energy counter and the power samples tell the same story
    for phase in (idle, load):
        assert phase["counter_power_w"] == pytest.approx(phase["mean_power_w"], rel=0.1)


def test_memory_used_matches_what_the_load_allocated(rec: dict) -> None:
    idle, load, after = (rec["phases"][k] for k in ("idle_before", "load", "idle_after"))
    allocated = rec["memory"]["allocated_by_load_mib"]
    assert allocated == pytest.approx(rec["meta"]["hold_gib"] * 1024)
    assert load["max_mem_used_mib"] - idle["max_mem_used_mib"] == pytest.approx(allocated, abs=256)
    assert after["max_mem_used_mib"] - idle["max_mem_used_mib"] < 256           # freed again
    s = summary_from_store(rec["summary"])
    assert s.peak_mem_used_mib == load["max_mem_used_mib"]


def test_ten_hz_sampling_is_cheap(rec: dict) -> None:
    o, s = rec["overhead"], rec["summary"]
    assert s["samples"] == pytest.approx(s["duration_s"] * rec["meta"]["hz"], rel=0.05)
    assert o["ms_per_sample_during_run"] < 20 and o["core_fraction_at_hz"] < 0.2
    assert o["throughput_change_pct"] > -3.0                                   # matmul barely notices


def test_series_and_one_line_summary(rec: dict) -> None:
    series = rec["series"]
    assert all(b["t"] > a["t"] for a, b in zip(series, series[1:]))
    energy = [r["energy_j"] for r in series]
    assert energy == sorted(energy) and energy[-1] == pytest.approx(rec["summary"]["energy_j"], rel=0.01)
    line = format_summary(rec["summary"])
    assert line.startswith("528 W mean / 696 W max") and "clocks held by sw_power_cap" in line
