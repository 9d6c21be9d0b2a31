"""From a telemetry summary to what a study optimises, stores and shows.

Objectives and the headroom constraint are computed here, once, so the tuner, the store and
`autotune show` agree on what "tokens per joule" and "headroom" mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from autotune.telemetry._stats import decimate
from autotune.telemetry.base import TelemetrySummary

SERIES_MAX_POINTS = 2000
_FIELDS = {f.name for f in dataclasses.fields(TelemetrySummary)}


def _power_for_rate(s: TelemetrySummary) -> float | None:
    """Mean power over the sampled window, from the energy counter when it spans time, else the
    power samples. Dividing throughput by power (not tokens by joules) keeps tokens/J right even when
    the sampler's window and the load window differ by a few hundred milliseconds."""
    if s.energy_j is not None and s.energy_window_s and s.energy_window_s > 0:
        return s.energy_j / s.energy_window_s
    return s.mean_power_w


def objectives(summary: TelemetrySummary, output_tokens: int, duration_s: float, num_gpus: int,
               output_tps: float) -> dict[str, float]:
    """The telemetry-based objectives (names as in DESIGN.md) a trial can report.

    `tps_per_gpu` always; `tokens_per_joule` only when power or energy was measured; `mem_headroom`
    only when memory was. Also records `summary.joules_per_token`, so the stored summary and
    `autotune show` carry it: call this before `summary_for_store`.
    """
    tps = output_tps if output_tps and output_tps > 0 else (output_tokens / duration_s if duration_s > 0 else 0.0)
    out: dict[str, float] = {"tps_per_gpu": tps / max(1, num_gpus)}
    power = _power_for_rate(summary)
    if power is not None and power > 0 and tps > 0:
        out["tokens_per_joule"] = tps / power
        summary.joules_per_token = round(power / tps, 6)
    headroom = summary.mem_headroom
    if headroom is not None:
        out["mem_headroom"] = headroom
    return out


def headroom_violation(summary: TelemetrySummary, margin: float) -> float | None:
    """Constraint `headroom` = margin - peak free fraction (> 0: the trial came within `margin` of
    the card's memory). None when memory was not measured, so no trial is judged on a guess."""
    headroom = summary.mem_headroom
    return None if headroom is None else margin - headroom


def spec_margin(spec: Mapping[str, Any] | None) -> float | None:
    """The headroom margin a stored study's spec asked for (`telemetry.headroom_margin`), None if unset."""
    return ((spec or {}).get("telemetry") or {}).get("headroom_margin")


def summary_for_store(summary: TelemetrySummary) -> dict[str, Any]:
    """The summary as a JSON-able dict, without the raw series (that goes to `series_for_store`)."""
    d = dataclasses.asdict(summary)
    d.pop("series", None)
    return d


def summary_from_store(data: Mapping[str, Any]) -> TelemetrySummary:
    """Rebuild a summary from `summary_for_store`'s dict; keys from other versions are ignored."""
    kwargs = {k: v for k, v in data.items() if k in _FIELDS}
    kwargs.setdefault("source", "none")
    return TelemetrySummary(**kwargs)


def series_for_store(summary: TelemetrySummary, max_points: int = SERIES_MAX_POINTS) -> list[dict[str, Any]]:
    """The raw series, evenly thinned to `max_points` rows (first and last kept)."""
    return decimate(summary.series, max_points)


def _gib(mib: float) -> str:
    gib = mib / 1024.0
    return f"{gib:.1f}" if gib < 100 else f"{gib:.0f}"


def format_summary(summary: TelemetrySummary | Mapping[str, Any], margin: float | None = None) -> str:
    """One line a person reads beside a trial's numbers, e.g. "312 W mean / 690 W max, 2.1 tok/J,
    peak 22.2 GiB of 140 (84% headroom), KV 63% peak, 12 preemptions". With `margin`, a trial that
    came within it of the card's memory is flagged."""
    s = summary if isinstance(summary, TelemetrySummary) else summary_from_store(summary)
    if s.source == "none":
        return f"no telemetry ({s.note})" if s.note else "no telemetry"
    parts: list[str] = []
    if s.mean_power_w is not None:
        parts.append(f"{s.mean_power_w:.0f} W mean / {s.max_power_w or s.mean_power_w:.0f} W max")
    if s.joules_per_token:
        parts.append(f"{1.0 / s.joules_per_token:.3g} tok/J")
    if s.cpu_pct_mean is not None:
        parts.append(f"CPU {s.cpu_pct_mean:.0f}%")
    if s.mean_util_pct is not None:
        parts.append(f"util {s.mean_util_pct:.0f}%")
    headroom = s.mem_headroom
    if s.peak_mem_used_mib is not None and s.mem_total_mib:
        what = "RSS peak" if s.source == "cpu" else "peak"
        parts.append(f"{what} {_gib(s.peak_mem_used_mib)} GiB of {_gib(s.mem_total_mib)} "
                     f"({100 * (headroom or 0.0):.0f}% headroom)")
    if s.peak_kv_usage_pct is not None:
        kv = s.peak_kv_usage_pct
        parts.append(f"KV {kv:.0f}% peak" if kv >= 10 or kv == 0 else f"KV {kv:.2g}% peak")
    if s.preemptions is not None:
        parts.append(f"{s.preemptions:.0f} preemptions")
    if s.prefix_cache_hit_rate is not None:
        parts.append(f"prefix hits {100 * s.prefix_cache_hit_rate:.0f}%")
    if s.max_waiting:
        parts.append(f"up to {s.max_waiting:.0f} waiting")
    notable = [r for r in s.throttle_reasons if r not in ("applications_clocks_setting",)]
    if notable:
        parts.append("clocks held by " + "+".join(notable))
    if margin is not None and headroom is not None and headroom < margin:
        parts.append(f"LOW HEADROOM (< {100 * margin:.0f}% margin)")
    if s.simulated:
        parts.append("simulated")
    if s.note:
        parts.append(s.note)
    return ", ".join(parts) if parts else f"{s.source}: nothing read"
