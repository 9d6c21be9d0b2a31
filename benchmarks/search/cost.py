"""GPU seconds per trial, fitted to the H200 study DBs of benchmarks/gpu (vLLM 0.24, 8B shape).

- startup: the first launch of a session (cold machine) and every later launch (a new config misses
  vLLM's compile cache: REFERENCE.md §2b), the medians of `startup_seconds` in the newest run
  (`pace2`: the per-study bytecode and compile caches as the study loop now sets them; the older runs
  started slower, 91 s against 54 s at the median), or in every run with `fit(current=False)`;
- a start that fails on the free-memory check: the wall time of the one seen (#4, startup_oom);
- load: each step's own measured window (output tokens / output tok/s) for the probe, full steps and
  steps cut short (medians over every run), plus the rest of the telemetry window spread over the steps
  (warm-up requests, prefix-cache resets, waits: the median per step);
- per trial: wall - startup - window (stopping the server, waiting for the GPU to be released).

The compile cache's saving is in the newest run's starts as far as it happened there (a new
scheduler-knob config still compiled for 14-21 s); nothing more is credited. A free rejection (known
constraint, memory model, duplicate, learned limit) costs 0.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import sqlite3
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DBS = (ROOT / "benchmarks/gpu/h200-llama8b.db", ROOT / "benchmarks/gpu/quality/h200-llama8b-quality.db",
       ROOT / "benchmarks/gpu/pace2/pace2.db.gz")
CURRENT = DBS[-1]          # the run whose starts are the study loop's as it is now


def _rows(db: Path) -> list[tuple[Any, ...]]:
    q = "select number, state, cause, startup_seconds, started_at, finished_at, capacity, telemetry " \
        "from autotune_trials order by number"
    if db.suffix != ".gz":
        with sqlite3.connect(db) as conn:
            return conn.execute(q).fetchall()
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(gzip.decompress(db.read_bytes()))
        return conn.execute(q).fetchall()
    finally:
        conn.close()


@dataclass(frozen=True)
class CostModel:
    startup_first_s: float
    startup_s: float
    failed_start_s: float
    probe_s: float
    full_step_s: float
    aborted_step_s: float
    overhead_s: float
    source: str

    def trial_s(self, trial: Any, first: bool) -> float:
        if not trial.launched:
            return 0.0
        if trial.startup_failed:
            return self.failed_start_s
        steps = trial.full_steps + trial.aborted_steps
        probe = bool(steps) and getattr(trial, "probed", True)      # a hinted search may have no probe
        load = (self.probe_s if probe else 0.0) + self.full_step_s * max(trial.full_steps - (1 if probe else 0), 0) \
            + self.aborted_step_s * trial.aborted_steps
        return (self.startup_first_s if first else self.startup_s) + load + self.overhead_s + trial.load_s_extra


def fit(current: bool = True) -> CostModel:
    """The cost model; `current`: starts from the newest run only (see the module's text)."""
    first, later, failed, overhead = [], [], [], []
    probe, full, cut, per_step = [], [], [], []
    for db in DBS:
        rows = _rows(db)
        launched = [r for r in rows if r[3] is not None]
        starts = db == CURRENT or not current
        for n, state, cause, startup, t0, t1, cap, tel in rows:
            wall = (dt.datetime.fromisoformat(t1) - dt.datetime.fromisoformat(t0)).total_seconds() if t0 and t1 else None
            if cause == "startup_oom" and wall:
                failed.append(wall)
            if startup is None or not cap or not tel:
                continue
            if starts:
                (first if launched and n == launched[0][0] else later).append(startup)
            steps = json.loads(cap)["steps"]
            window = json.loads(tel)["duration_s"]
            spans = [(s.get("total_output_tokens") or 0) / s["output_throughput"] if s.get("output_throughput")
                     else 0.0 for s in steps]
            probe.append(spans[0])
            for s, span in zip(steps[1:], spans[1:]):
                (cut if s.get("aborted_early") else full).append(span)
            per_step.append((window - sum(spans)) / len(steps))
            overhead.append(wall - startup - window)
    gap = statistics.median(per_step)
    return CostModel(statistics.median(first), statistics.median(later), statistics.median(failed),
                     statistics.median(probe) + gap, statistics.median(full) + gap, statistics.median(cut) + gap,
                     statistics.median(overhead),
                     f"{len(probe)} measured H200 trials in {', '.join(p.name for p in DBS)}; starts from "
                     + (CURRENT.name if current else "all"))


if __name__ == "__main__":
    print(fit())
