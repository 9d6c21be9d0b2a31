"""The capacity search's trace mode (`search: time_scale`): load is the trace's speed-up, so that the
search's rule "more load, more latency" holds (load 2 = time_scale 0.5 = twice the recorded rate).

The single-stream probe gives requests per second; divided by the trace's recorded mean rate it is the
speed-up the search starts from. A step replays the trace's window once (or `requests_per_step` of its
requests, when fewer), after the warm-up requests: its bursts, lengths and conversations as recorded.
A trace sped up until its step is one burst offers no more load however much faster it goes, so the
search stops there (`replay_upper`) and reports a capacity "at least" that high.
"""

from __future__ import annotations

import math
from dataclasses import replace

from autotune.bench.results import ClientHealth, Measurement
from autotune.bench.workloads import TraceWorkload, Workload
from autotune.errors import UserError

DRIFT_GAPS = 0.5        # a replay whose p99 send error exceeds half the trace's median gap ...
DRIFT_FLOOR_MS = 10.0   # ... and this (a burst logged at one instant has gaps of 0) fell behind the trace


def replay_rate(workload: Workload) -> float:
    """The trace's recorded requests per second; a user error for anything but a trace with a span."""
    if not isinstance(workload, TraceWorkload):
        raise UserError(f"capacity search by time_scale needs a trace workload (trace:path=FILE), not {workload.kind}")
    rate = workload.mean_rate()
    if rate is None:
        raise UserError(f"trace {workload.path}: all its requests arrive at one instant; no rate to scale")
    return rate


def replay_requests(workload: Workload, per_step: int, warmup: int) -> int:
    """Requests in one step: the rest of the trace's window after the warm-up requests (the whole window
    when it is no longer than the warm-up), at most `per_step`."""
    size = getattr(workload, "size", per_step)
    return max(1, min(per_step, size - warmup if size > warmup else size))


def replay_upper(workload: Workload, probe: Measurement, n: int) -> float:
    """The highest speed-up worth measuring: where a step's `n` requests arrive within a quarter of one
    request's time (the probe's median end-to-end latency). Faster than that the step is one burst of `n`
    requests whatever the speed-up, so a server that serves that burst within the SLO would otherwise
    let the search climb without end; capacity is then reported as "at least" this."""
    e2el = probe.metrics.get("median_e2el_ms")
    if not isinstance(workload, TraceWorkload) or not e2el or workload.size < 2:
        return math.inf
    span = (workload.records[-1].t - workload.records[0].t) * min(n, workload.size - 1) / (workload.size - 1)
    return float(f"{4.0 * span / (e2el / 1000.0):.3g}") if span > 0 else math.inf


def replay_cap_note(load: float) -> str:
    return (f"the trace's window sent as one burst (x{load:g}) still met the SLO: capacity is at least that; "
            "replay a longer window (more requests) to find it")


def held_schedule(health: ClientHealth, metrics: dict[str, float], mode: str) -> ClientHealth:
    """A trace replay that fell behind its schedule offered the server another workload than the trace:
    flag it as the client's saturation (its latencies are not the trace's), never silently. Within half
    a median gap no two requests swap places and a burst still reaches the server as a burst."""
    drift, gap = metrics.get("p99_send_drift_ms"), metrics.get("median_send_gap_ms")
    if mode != "trace" or drift is None:
        return health
    limit = max(DRIFT_GAPS * (gap or 0.0), DRIFT_FLOOR_MS)
    if drift <= limit:
        return health
    note = f"send times fell behind the trace: p99 {drift:.1f} ms late against {gap or 0:.1f} ms median gaps"
    return replace(health, saturated=True, note="; ".join(x for x in (health.note, note) if x))
