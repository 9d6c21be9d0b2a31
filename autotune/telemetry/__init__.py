"""Telemetry: a background sampler over only the trial's GPUs (or the server's process tree) during
each measured load step, plus vLLM's own `/metrics`, summarised per trial.

Sources, one module each behind `base.TelemetrySource`: `nvml` (NVIDIA's library), `cpu` (psutil
over the server's process tree, for the CPU build), `sim` (the simulator's telemetry), `none`.

    >>> src = get_source("none")
    >>> s = src.sampler(TelemetryTarget(server_pid=None, gpus=[]))
    >>> s.start(); format_summary(s.stop())
    'no telemetry (telemetry off: nothing measured)'

Importing this package needs only psutil and httpx; pynvml is imported when `nvml` is used.
"""

from __future__ import annotations

from typing import Sequence

from autotune.errors import UserError
from autotune.telemetry.base import Sampler, TelemetrySource, TelemetrySummary, TelemetryTarget
from autotune.telemetry.cpu import CpuSource
from autotune.telemetry.metrics import MetricsScraper, VllmReading, parse_prometheus
from autotune.telemetry.none import NoneSource
from autotune.telemetry.nvml import NvmlSource, nvml_unavailable_reason
from autotune.telemetry.sim import SimSource
from autotune.telemetry.summary import (format_summary, headroom_violation, objectives,
                                        series_for_store, summary_for_store, summary_from_store)

SOURCES = ("nvml", "cpu", "sim", "none")


def get_source(name: str) -> TelemetrySource:
    """The source called `name`. `nvml` is checked here, at study start, so a host without NVML
    fails in one line before any server is launched rather than in every trial."""
    if name == "nvml":
        reason = nvml_unavailable_reason()
        if reason is not None:
            raise UserError(f"telemetry source 'nvml' is not usable here: {reason} (use source: cpu, or auto)")
        return NvmlSource()
    if name == "cpu":
        return CpuSource()
    if name == "sim":
        return SimSource()
    if name == "none":
        return NoneSource()
    raise UserError(f"unknown telemetry source {name!r} (choose one of: auto, {', '.join(SOURCES)})")


def auto_source(engine_kind: str, gpus: Sequence[int]) -> TelemetrySource:
    """The best source for a study: the simulator's own for `sim`; NVML when it answers and the
    trial has GPUs; else the server's process tree (the CPU build)."""
    if engine_kind == "sim":
        return SimSource()
    if gpus and nvml_unavailable_reason() is None:
        return NvmlSource()
    return CpuSource()


__all__ = [
    "SOURCES", "CpuSource", "NoneSource", "NvmlSource", "SimSource", "Sampler", "TelemetrySource", "TelemetrySummary", "TelemetryTarget", "MetricsScraper",
    "VllmReading", "auto_source", "format_summary", "get_source", "headroom_violation", "objectives",
    "parse_prometheus", "series_for_store", "summary_for_store", "summary_from_store",
]
