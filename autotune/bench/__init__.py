"""Load generation and capacity under the SLO.

A pipeline of small stages: workloads (what each request asks) → arrivals (when it goes) → client (a
streamed request, timed on arrival) → metrics (vLLM's definitions, goodput) → capacity search. The
trial runner calls `run_load` (one load level) or `find_capacity` (the highest load meeting the SLO);
`autotune bench` is `command.main`.
"""

from autotune.bench.capacity import capacity_objectives, find_capacity
from autotune.bench.results import CapacityResult, ClientHealth, LoadStep, Measurement, RequestRecord
from autotune.bench.runner import run_load
from autotune.bench.workloads import Prompt, Workload, parse_workload

__all__ = ["CapacityResult", "ClientHealth", "LoadStep", "Measurement", "Prompt", "RequestRecord", "Workload",
           "capacity_objectives", "find_capacity", "parse_workload", "run_load"]
