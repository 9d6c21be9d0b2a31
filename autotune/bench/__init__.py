"""Load generation and capacity under the SLO.

A pipeline of small stages: workloads (what each request asks) → arrivals (when it goes) → client (a
streamed request, timed on arrival) → metrics (vLLM's definitions, goodput) → capacity search. The
trial runner calls `run_load` (one load level) or `find_capacity` (the highest load meeting the SLO);
`autotune bench` is `command.main`.

The names below load their module on first use: the simulator's server imports `bench.images` alone,
once per simulated trial, and the whole pipeline (httpx, aiohttp's client, telemetry) doubled its start.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"capacity_objectives": "capacity", "find_capacity": "capacity", "run_load": "runner",
          "CapacityResult": "results", "ClientHealth": "results", "LoadStep": "results", "Measurement": "results",
          "RequestRecord": "results", "Prompt": "workloads", "Workload": "workloads", "parse_workload": "workloads"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'autotune.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autotune.bench.{_WHERE[name]}"), name)
