"""Per-GPU readings -> one series row per sample and the GPU fields of a summary.

Shared by `nvml` (hardware) and `sim` (the simulator's JSON), which read the same quantities from
different places. Across the trial's GPUs, power and energy add up (what the trial costs), memory is
the fullest card's (what runs out first), utilisation and clocks are averaged, temperature is the
hottest card's.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from autotune.telemetry._stats import RunningStats
from autotune.telemetry.base import TelemetrySummary

THROTTLE_BITS: dict[int, str] = {   # NVML's clock-event reason bits (nvmlClocksEventReason*)
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def _mean(v: list[float]) -> float:
    return sum(v) / len(v)


_COMBINE = {"power_w": sum, "util_pct": _mean, "mem_util_pct": _mean, "mem_used_mib": max,
            "sm_clock_mhz": _mean, "mem_clock_mhz": _mean, "temp_c": max}


class GpuAggregate:
    """Folds samples of several GPUs into bounded running statistics."""

    def __init__(self, indices: Sequence[int]) -> None:
        self.indices = list(indices)
        self.stats = RunningStats()
        self.throttle_seen = 0
        self.throttle_read = False
        self._energy0: dict[int, float] = {}
        self._energy: dict[int, float] = {}
        self._energy_missed = False
        self._peak_used: dict[int, float] = {}
        self._total: dict[int, float] = {}
        self._last_power: tuple[float, float] | None = None
        self._power_integral_j = 0.0
        self._span: tuple[float, float] | None = None

    def add(self, t: float, readings: Sequence[Mapping[str, Any]], clock: float | None = None) -> dict[str, Any]:
        """Fold one sample; `readings` has one mapping per GPU (keys as in _COMBINE plus index,
        energy_mj, mem_total_mib, throttle; missing or None = not read). `clock` is the source's own
        time when it differs from the wall clock (the simulator's), used for energy and power rates."""
        clk = t if clock is None else clock
        self._span = (clk, clk) if self._span is None else (self._span[0], clk)
        per: dict[str, list[float]] = {}
        mask = 0
        for r in readings:
            idx = int(r.get("index", 0))
            for key in _COMBINE:
                v = r.get(key)
                if v is not None:
                    per.setdefault(key, []).append(float(v))
            used, total = r.get("mem_used_mib"), r.get("mem_total_mib")
            if used is not None:
                self._peak_used[idx] = max(self._peak_used.get(idx, 0.0), float(used))
            if total:
                self._total[idx] = float(total)
            e = r.get("energy_mj")
            if e is None:
                self._energy_missed = True
            else:
                self._energy0.setdefault(idx, float(e))
                self._energy[idx] = float(e)
            thr = r.get("throttle")
            if thr is not None:
                mask |= int(thr)
                self.throttle_read = True
        self.throttle_seen |= mask
        row: dict[str, Any] = {"t": round(t, 3)}
        for key, fn in _COMBINE.items():
            if key in per:
                row[key] = round(fn(per[key]), 2)
                self.stats.add(key, row[key])
        if "power_w" in row:
            self._integrate(clk, row["power_w"])
        if readings and all(r.get("energy_mj") is not None for r in readings):
            row["energy_j"] = round(sum(self._energy[i] - self._energy0[i] for i in self._energy) / 1000.0, 3)
        if self.throttle_read:
            row["throttle"] = mask
        if len(readings) > 1 and "power_w" in per:
            row["gpu_power_w"] = [round(v, 1) for v in per["power_w"]]
        return row

    def _integrate(self, t: float, power_w: float) -> None:
        if self._last_power is not None:
            t0, p0 = self._last_power
            self._power_integral_j += (t - t0) * (p0 + power_w) / 2.0
        self._last_power = (t, power_w)

    def summarise(self, s: TelemetrySummary) -> None:
        s.gpus = list(self.indices)
        s.mean_power_w = _r(self.stats.mean("power_w"))
        s.max_power_w = _r(self.stats.max("power_w"))
        s.mean_util_pct = _r(self.stats.mean("util_pct"))
        s.mean_mem_util_pct = _r(self.stats.mean("mem_util_pct"))
        s.max_temp_c = _r(self.stats.max("temp_c"))
        s.throttle_reasons = [n for n in throttle_names(self.throttle_seen) if n != "gpu_idle"]
        cards = [i for i in self._peak_used if self._total.get(i)]
        if cards:
            fullest = max(cards, key=lambda i: self._peak_used[i] / self._total[i])
            s.peak_mem_used_mib = _r(self._peak_used[fullest])
            s.mem_total_mib = _r(self._total[fullest])
        if self._energy and not self._energy_missed:
            s.energy_j = round(sum(self._energy[i] - self._energy0[i] for i in self._energy) / 1000.0, 3)
            s.energy_method = "counter"
        elif self.stats.count("power_w") >= 2:
            s.energy_j = round(self._power_integral_j, 3)
            s.energy_method = "power_integral"
        if s.energy_j is not None and self._span is not None:
            # Energy counts from the first sample to the last: rates use that span, not the wall window.
            s.energy_window_s = round(self._span[1] - self._span[0], 3)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
