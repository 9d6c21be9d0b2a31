"""What a met load step already says about the next one: a ceiling on the capacity search's growth.

Between met steps the search extrapolates a line through the last two (capacity.py). Serving latency is
not a line: it stays nearly flat while the server batches more streams and turns up sharply where
requests begin to wait, for a batch slot, for room in the KV cache, or behind each other's prefills. On
an H200 with several-thousand-token prompts and a TPOT bound, one trial stepped 1, 12, 18 (met; its
worst term barely moved from 12 to 18), then 77, 37, 26 and 22, all four broken. A met step holds the
evidence that bounds such a jump:

- **the server's own limits.** More streams than `max_num_seqs` (times the data-parallel ranks), or more
  than the requests its KV cache holds (the KV-cache size the server logged over the tokens one request
  of this step held), queue for a slot, and the first to wait may wait a whole request (load / X, X the
  requests completed per second: streams of equal length finish in waves). Where that wait alone would
  break a limit, growth stops at the knee (the step there is often the capacity) and, from the knee, goes
  one stream past it; otherwise it may pass the knee by the streams the queue allows (below).
- **queueing.** Beyond a knee, or where the request throughput hardly grew with the last steps' extra
  load (it gained less than `SATURATED` of the load's growth; never judged against the one-stream probe),
  every added stream waits. In a closed loop, concurrency = throughput x latency (Little's law): with X
  flat, each added stream adds 1/X to the mean time a request spends, all of it waiting for its first
  token. So the terms that include the wait (TTFT, E2EL) reach their limit near
  `load + (limit - value) x X`. An SLO without such a term sets no bound here: waiting does not break it.
- **each SLO term on its own.** The worst term's margin can sit still while another rises; each term's
  line through the last two met steps crosses its limit somewhere, and the nearest crossing counts.

None of this changes the bracket rules: a ceiling only lowers the next load of a search that has not
broken the SLO yet (or whose broken end was cut short and says little), never below one stream (a rate:
3 %) above the highest met load; the answer is still the highest met and lowest broken load measured.
Measured on stand-ins and simulated landscapes: tests/unit/test_capacity_step_bounds.py,
benchmarks/search/steps.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from autotune.bench.metrics import slo_margins
from autotune.bench.results import Measurement
from autotune.flags import flags_to_mapping
from autotune.slo import SLO

SATURATED = 0.25          # throughput gained less than this share of the load's growth: the server is full
WAIT_TERMS = ("ttft", "e2el")   # the latency terms a request's wait for its first token adds to
MIN_GROWTH = 0.03         # a rate search's smallest step above the highest met load (the search's tolerance)


@dataclass(frozen=True)
class ServerLimits:
    """The most streams the server batches (`max_num_seqs` x data-parallel ranks) and its KV cache in
    tokens (all ranks), as far as they are known."""

    max_seqs: int | None = None
    kv_tokens: int | None = None

    @classmethod
    def from_flags(cls, flags: Sequence[str], kv_tokens: int | None) -> "ServerLimits":
        """From the launch's flags and the KV-cache size the server logged (per engine, as vLLM logs it).
        A PD split (pdlayout.py) batches its streams on its decode instances: each one's limits, times them."""
        from autotune.pdlayout import instances_of, layout_of

        m = flags_to_mapping(flags)
        layout = layout_of(m) if instances_of(m) > 1 else None
        dp = (_positive(m.get("data_parallel_size")) or 1) * (layout.decode if layout is not None else 1)
        seqs = _positive(m.get("max_num_seqs"))
        return cls(seqs * dp if seqs else None, kv_tokens * dp if kv_tokens else None)

    def knee(self, tokens_per_request: float | None) -> float | None:
        """Concurrency above which requests wait for a slot, or None when neither limit is known."""
        caps = [float(self.max_seqs)] if self.max_seqs else []
        if self.kv_tokens and tokens_per_request:
            caps.append(float(int(self.kv_tokens / tokens_per_request)))
        return min(caps) if caps else None


@dataclass(frozen=True)
class StepEvidence:
    """What one step measured that bears on the next: each SLO term as (metric, value ms, limit ms),
    completed requests per second, requests in flight on average (Little's law: rate x mean E2EL; a
    closed loop's is its concurrency) and the tokens one request held (prompt + output)."""

    terms: Mapping[str, tuple[str, float, float]]
    request_rate: float
    in_flight: float
    tokens_per_request: float | None = None

    @classmethod
    def of(cls, m: Measurement, slo: SLO) -> "StepEvidence | None":
        """From a finished step's records; None when it completed nothing to learn from."""
        ok = [r for r in m.records if r.ok]
        rate = float(m.metrics.get("request_throughput") or 0.0)
        e2el = float(m.metrics.get("mean_e2el_ms") or 0.0)
        if not ok or rate <= 0 or e2el <= 0:
            return None
        margins = slo_margins(m.records, slo)
        terms = {t.key: (t.metric, margins[t.key] + t.limit_ms, t.limit_ms) for t in slo.terms
                 if margins[t.key] != float("inf")}
        tokens = sum(r.input_tokens + r.output_tokens for r in ok) / len(ok)
        return cls(terms, rate, rate * e2el / 1000.0, tokens or None)

    def margins(self) -> dict[str, float]:
        """Each term's measured / limit - 1."""
        return {k: v / limit - 1.0 for k, (_, v, limit) in self.terms.items()}


def saturated(load: float, ev: StepEvidence, below: Sequence[tuple[float, StepEvidence]]) -> bool:
    """Since some met step below, the request throughput gained less than SATURATED of the load's growth.
    Not against the single-stream probe: one stream is the least efficient batch, so from there throughput
    grows slower than the load on every server, queueing or not."""
    for x, e in below:
        if 1 < x < load and e.request_rate > 0 and \
                ev.request_rate / e.request_rate - 1.0 < SATURATED * (load / x - 1.0):
            return True
    return False


def ceiling(load: float, ev: StepEvidence, below: Sequence[tuple[float, StepEvidence]],
            limits: ServerLimits | None, integer: bool) -> float | None:
    """The highest next load the met step at `load` (and the met steps `below` it) allow, in the search's
    units (streams, or requests/s for a rate search); None when the evidence sets no bound. Waiting
    breaks only the SLO's TTFT and E2EL terms: an SLO without them sets no bound here."""
    waits = [(value, limit) for metric, value, limit in ev.terms.values() if metric in WAIT_TERMS]
    if not waits:
        return None
    knee = limits.knee(ev.tokens_per_request) if limits is not None else None
    nearest = load + 1 if integer else load * (1 + MIN_GROWTH)
    bound: float | None = None
    if not integer:
        # open loop: the knee in requests/s is where the requests in flight (Little: rate x E2EL) fill the
        # slots; above it the queue has no bound
        if knee is not None and ev.in_flight > 0:
            bound = knee * load / ev.in_flight
    elif knee is not None and knee >= load:
        # the first stream past the knee may wait a whole request (load / X: streams of equal length
        # leave in waves); where that breaks a limit, the knee itself is the step to measure, and the
        # stream after it the bracket's broken end
        one_request_ms = load / ev.request_rate * 1000.0
        if any(value + one_request_ms > limit for value, limit in waits):
            bound = knee if knee > load else load + 1
        else:   # below the knee the throughput grows at most with the streams
            bound = math.floor(knee + _allowance(waits, ev.request_rate * knee / load))
    elif knee is not None or saturated(load, ev, below):
        bound = math.floor(load + _allowance(waits, ev.request_rate))
    return None if bound is None else max(bound, nearest)


def _allowance(waits: Sequence[tuple[float, float]], request_rate: float) -> float:
    """Streams that may wait beyond a full batch before a wait term reaches its limit: each adds 1/X to
    every request's wait (Little's law, closed loop)."""
    return min(max(limit - value, 0.0) for value, limit in waits) / 1000.0 * request_rate


def term_crossing(lo: tuple[float, StepEvidence], prev: tuple[float, StepEvidence]) -> float | None:
    """The nearest load at which one term's line through two met steps crosses its limit (None: no term
    rose between them)."""
    (x1, e1), (x0, e0) = lo, prev
    if x1 <= x0:
        return None
    m1, m0 = e1.margins(), e0.margins()
    out = [x1 + (-m1[k]) * (x1 - x0) / (m1[k] - m0[k]) for k in m1 if k in m0 and m1[k] > m0[k] and m1[k] <= 0]
    return min(out) if out else None


def _positive(value: object) -> int | None:
    try:
        n = int(str(value))
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None
