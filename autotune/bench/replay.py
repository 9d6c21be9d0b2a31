"""The capacity search's trace mode (`search: time_scale`): load is the trace's speed-up, so that the
search's rule "more load, more latency" holds (load 2 = time_scale 0.5 = twice the recorded rate).

The single-stream probe gives requests per second; divided by the trace's recorded mean rate it is the
speed-up the search starts from. A step replays the trace's window once (or `requests_per_step` of its
requests, when fewer), after the warm-up requests: its bursts, lengths and conversations as recorded.
"""

from __future__ import annotations

from autotune.bench.workloads import TraceWorkload, Workload
from autotune.errors import UserError


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
