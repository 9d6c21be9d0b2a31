"""The printed result, laid out like `vllm bench serve`'s so the two read side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from autotune.bench.metrics import PERCENTILES
from autotune.bench.results import CapacityResult, Measurement
from autotune.slo import CLASSES

_NAMES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
          "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


def _row(label: str, value: Any) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{label:<40} {value:<10}"


def format_measurement(m: Measurement, title: str = "Serving Benchmark Result") -> str:
    x = m.metrics
    lines = [f"{' ' + title + ' ':=^50}",
             _row("Successful requests:", int(x["completed"])),
             _row("Failed requests:", int(x["failed"]))]
    if m.load.get("concurrency") is not None:
        lines.append(_row("Maximum request concurrency:", m.load["concurrency"]))
    if m.load.get("request_rate") is not None:
        lines.append(_row("Request rate (req/s):", float(m.load["request_rate"])))
    if m.load.get("time_scale") is not None:
        lines.append(_row("Trace replay time scale:", float(m.load["time_scale"])))
    lines += [_row("Benchmark duration (s):", x["duration"]),
              _row("Total input tokens:", int(x["total_input_tokens"])),
              _row("Total generated tokens:", int(x["total_output_tokens"])),
              _row("Request throughput (req/s):", x["request_throughput"])]
    if "goodput" in x:
        lines += [_row("Request goodput (req/s):", x["goodput"]), _row("SLO attainment (%):", x["slo_attainment_pct"])]
    if x.get("prefix_cache_hit_pct") is not None:
        lines.append(_row("Prefix cache hits (server, %):", x["prefix_cache_hit_pct"]))
    if x.get("spec_acceptance_pct") is not None:     # the server ran speculative decoding (its /metrics)
        lines += [_row("Draft tokens (speculative):", int(x["spec_draft_tokens"])),
                  _row("Draft acceptance rate (%):", x["spec_acceptance_pct"])]
    if x.get("steady_output_throughput") is not None:
        lines.append(_row("Steady output throughput (tok/s):", x["steady_output_throughput"]))
    lines += [_row("Output token throughput (tok/s):", x["output_throughput"]),
              _row("Peak concurrent requests:", int(x["max_concurrent_requests"])),
              _row("Total token throughput (tok/s):", x["total_token_throughput"])]
    for key, name in _NAMES.items():
        if f"mean_{key}_ms" not in x:
            continue
        lines.append(f"{name:-^50}")
        lines += [_row(f"Mean {key.upper()} (ms):", x[f"mean_{key}_ms"]),
                  _row(f"Median {key.upper()} (ms):", x[f"median_{key}_ms"])]
        lines += [_row(f"P{p:g} {key.upper()} (ms):", x[f"p{p:g}_{key}_ms"]) for p in PERCENTILES]
    lines += _class_lines(x)
    if "p99_send_drift_ms" in x:
        lines.append(f"{'Send Time Drift (vs schedule)':-^50}")
        lines += [_row("Median send drift (ms):", x["median_send_drift_ms"]),
                  _row("P99 send drift (ms):", x["p99_send_drift_ms"]),
                  _row("Max send drift (ms):", x["max_send_drift_ms"])]
        if "median_send_gap_ms" in x:
            lines.append(_row("Median scheduled gap (ms):", x["median_send_gap_ms"]))
    lines.append("=" * 50)
    if m.aborted_early:
        lines.append(f"aborted early: {m.load.get('abort_reason')}")
    c = m.client
    lines.append(("CLIENT SATURATED, latencies not trusted: " if c.saturated else "client: ") + c.note
                 + (f"; CPU {c.cpu_pct:.0f}% of a core" if c.cpu_pct is not None else ""))
    if "prefix_hits" in m.flags:
        lines.append(f"FLATTERED: the prefix cache served {x.get('prefix_cache_hit_pct', 0):.1f} % of the prompt "
                     f"tokens of prompts meant to be new: TTFT and throughput are better than a fresh load would get"
                     + ("" if m.load.get("cache_reset", True) else
                        " (the cache could not be reset: start vLLM with VLLM_SERVER_DEV_MODE=1)"))
    wave = m.first_wave_summary()
    if wave is not None:
        lines.append(f"first wave (not in the figures): {wave['requests']} requests, median TTFT "
                     f"{wave.get('median_ttft_ms', math.nan):.1f} ms, p99 TTFT {wave.get('p99_ttft_ms', math.nan):.1f} ms")
    return "\n".join(lines)


def _class_lines(x: dict[str, Any]) -> list[str]:
    """Requests with images and without, side by side (only when some request carried an image)."""
    present = [c for c in CLASSES if f"{c}_completed" in x]
    if not present:
        return []
    lines = [f"{'Requests by class':-^50}", _row("Images per second:", x.get("images_per_s", 0.0)),
             _row("Total images:", int(x.get("total_images", 0))),
             f"{'':<22}" + "".join(f"{c:>14}" for c in present)]
    rows = [("Successful requests", "completed", "{:.0f}"), ("Failed requests", "failed", "{:.0f}"),
            ("Mean input tokens", "mean_input_tokens", "{:.1f}"), ("Request thpt (req/s)", "request_throughput", "{:.2f}"),
            ("Output thpt (tok/s)", "output_throughput", "{:.2f}"), ("Median TTFT (ms)", "median_ttft_ms", "{:.2f}"),
            ("P99 TTFT (ms)", "p99_ttft_ms", "{:.2f}"), ("Median TPOT (ms)", "median_tpot_ms", "{:.2f}"),
            ("P99 E2EL (ms)", "p99_e2el_ms", "{:.2f}")]
    for label, key, fmt in rows:
        cells = [x.get(f"{c}_{key}") for c in present]
        lines.append(f"{label:<22}" + "".join(f"{'-' if v is None else fmt.format(v):>14}" for v in cells))
    return lines


def _class_ttft(x: dict[str, Any]) -> str:
    return "".join(f"  p99 TTFT {c} {x[f'{c}_p99_ttft_ms']:.1f} ms" for c in CLASSES if f"{c}_p99_ttft_ms" in x)


def format_capacity(r: CapacityResult) -> str:
    lines = [f"{' Capacity under SLO (' + r.mode + ') ':=^50}"]
    unit = "x the trace's rate" if r.mode == "time_scale" else ""
    for i, s in enumerate(r.steps, 1):
        x = s.measurement.metrics
        lines.append(f"step {i}: load {s.load:g}{unit and ' (x)'}  {'met ' if s.slo_met else 'BROKE'}  "
                     f"out {x.get('output_throughput', 0):.1f} tok/s  "
                     f"p50 TTFT {x.get('median_ttft_ms', math.nan):.1f} ms  p50 TPOT {x.get('median_tpot_ms', math.nan):.2f} ms"
                     + _class_ttft(x) + ("  (aborted early)" if s.measurement.aborted_early else ""))
    lines.append(_row("Capacity:", "none (SLO broken at the lowest load)" if r.capacity is None else
                      f"{r.capacity:g} {unit}".strip()
                      + (f" (time_scale {1 / r.capacity:.3g})" if unit and r.capacity else "")))
    lo, hi = r.bracket
    if lo is not None:
        lines.append(_row("Bracket (met .. broke):", f"{lo:g} .. {'-' if hi is None else f'{hi:g}'}"))
    if r.flags:
        lines.append("measurement flags: " + ", ".join(r.flags))
    if not r.cache_reset:
        lines.append("cache not reset: the server has no /reset_prefix_cache (start vLLM with VLLM_SERVER_DEV_MODE=1)")
    if r.note:
        lines.append("note: " + r.note)
    if r.at_capacity is not None:
        lines.append(format_measurement(r.at_capacity, "At capacity"))
    return "\n".join(lines)


def write_json(path: str, data: dict[str, Any]) -> None:
    """JSON as `vllm bench serve` writes it (an infinite rate is the string "inf")."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and math.isinf(v):
            return "inf"
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    Path(path).write_text(json.dumps(clean(data), indent=1) + "\n", encoding="utf-8")
