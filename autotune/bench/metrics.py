"""From per-request records to the numbers `vllm bench serve` reports, plus goodput and SLO attainment.

Same definitions as vLLM's `calculate_metrics` so the two agree on the same data: percentiles are
numpy's linear interpolation; TPOT is (E2EL - TTFT) / (output tokens - 1) over requests with more than
one output token; ITLs pool every gap of every successful request; E2EL ends at the last token; the
duration runs from the first send to the last completion. Two deliberate differences: a statistic with
no samples is left out rather than reported as 0 (a 0 ms TTFT when every request failed would pass any
SLO), and `max_concurrent_requests` is the true peak of requests in flight (a sweep over start/end
times), not vLLM's per-second bucket count.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from autotune.bench.results import RequestRecord
from autotune.slo import CLASSES, SLO, request_class, stat_key

PERCENTILES = (90.0, 95.0, 99.0, 99.9)
FAILED_MS = 1e9   # a failed request's latency in SLO checks: finite so that percentiles interpolate


def _pct_name(p: float) -> str:
    return f"p{p:g}"


def distribution(values: Sequence[float], name: str, cls: str | None = None) -> dict[str, float]:
    """mean/median/std and PERCENTILES of `values`, keyed like vLLM (`median_ttft_ms`, `p99_ttft_ms`);
    a class's own figures carry its name in front (`image_p99_ttft_ms`)."""
    if len(values) == 0:
        return {}
    arr = np.asarray(values, dtype=float)
    out = {stat_key(name, "mean", cls): float(arr.mean()), stat_key(name, "p50", cls): float(np.median(arr)),
           (f"{cls}_" if cls else "") + f"std_{name}_ms": float(arr.std())}
    for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[stat_key(name, _pct_name(p), cls)] = float(v)
    return out


def _latencies(ok: Sequence[RequestRecord], cls: str | None = None) -> dict[str, float]:
    out = distribution([r.ttft_ms for r in ok if r.ttft_ms is not None], "ttft", cls)
    out.update(distribution([t for r in ok if (t := r.tpot_ms) is not None], "tpot", cls))
    out.update(distribution([x for r in ok for x in r.itl_ms], "itl", cls))
    out.update(distribution([r.e2el_ms for r in ok if r.e2el_ms is not None], "e2el", cls))
    return out


def class_figures(records: Sequence[RequestRecord], duration_s: float) -> dict[str, float]:
    """Requests with images and without, each summarized apart (keys prefixed `image_` / `text_`), and
    the images served per second (`images_per_s`, `total_images`). Empty when no request carried an
    image: a text-only run keeps exactly `vllm bench serve`'s keys."""
    if not any(r.images for r in records):
        return {}
    dur = max(duration_s, 1e-9)
    ok_images = sum(r.images for r in records if r.ok)
    out: dict[str, float] = {"total_images": ok_images, "images_per_s": ok_images / dur}
    for cls in CLASSES:
        mine = [r for r in records if request_class(r.images) == cls]
        if not mine:
            continue
        ok = [r for r in mine if r.ok]
        tout = sum(r.output_tokens for r in ok)
        out.update({f"{cls}_completed": len(ok), f"{cls}_failed": len(mine) - len(ok),
                    f"{cls}_total_input_tokens": sum(r.input_tokens for r in ok),
                    f"{cls}_request_throughput": len(ok) / dur, f"{cls}_output_throughput": tout / dur})
        if ok:
            out[f"{cls}_mean_input_tokens"] = sum(r.input_tokens for r in ok) / len(ok)
        out.update(_latencies(ok, cls))
    return out


def peak_concurrency(records: Iterable[RequestRecord]) -> int:
    """Most requests in flight at one instant (successful and failed alike: both held a slot)."""
    events: list[tuple[float, int]] = []
    for r in records:
        end = r.start_s + (r.e2el_ms or 0.0) / 1000.0
        events += [(r.start_s, 1), (end, -1)]
    peak = cur = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        cur += d
        peak = max(peak, cur)
    return peak


def steady_output_throughput(records: Sequence[RequestRecord], t0: float) -> float | None:
    """Output tokens/s while the load was fully offered: from the start of the run to the last request's
    dispatch. After that no finished request is replaced, the server drains a shrinking batch, and a
    whole-run average (vLLM's `output_throughput`) counts that tail: at a few closed-loop waves per step
    it moves by up to ~10 % with where the last partial wave falls, which is the size of the differences
    a tuner has to rank. Tokens are placed at their chunks' arrival times (a request's tokens spread
    evenly over its chunks). None when the window holds no whole request."""
    ok = [r for r in records if r.ok and r.ttft_ms is not None and r.e2el_ms is not None]
    if not ok:
        return None
    t_end = max(r.start_s for r in records)
    if t_end - t0 < min(r.e2el_ms for r in ok) / 1000.0:
        return None
    tokens = 0.0
    for r in ok:
        per_chunk = r.output_tokens / (len(r.itl_ms) + 1)
        t = r.start_s + r.ttft_ms / 1000.0
        inside = int(t0 <= t <= t_end)
        for gap in r.itl_ms:
            t += gap / 1000.0
            inside += t0 <= t <= t_end
        tokens += per_chunk * inside
    return tokens / (t_end - t0)


def capacity_tps(metrics: dict[str, float]) -> float | None:
    """Output tokens/s of a step at capacity: over its fully-loaded window where it has one
    (steady_output_throughput; the twin's own window is sim/inprocess.py's), else over the whole step."""
    return metrics.get("steady_output_throughput") or metrics.get("output_throughput")


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: SLO | None = None) -> dict[str, float]:
    """The result dictionary of one load run (keys as in results.py)."""
    ok = [r for r in records if r.ok]
    failed = len(records) - len(ok)
    dur = max(duration_s, 1e-9)
    tin = sum(r.input_tokens for r in ok)
    tout = sum(r.output_tokens for r in ok)
    out: dict[str, float] = {
        "duration": duration_s, "completed": len(ok), "failed": failed,
        "total_input_tokens": tin, "total_output_tokens": tout,
        "request_throughput": len(ok) / dur, "output_throughput": tout / dur,
        "total_token_throughput": (tin + tout) / dur,
        "max_concurrent_requests": peak_concurrency(records),
    }
    out.update(_latencies(ok))
    out.update(class_figures(records, duration_s))
    out.update(send_drift(records))
    if slo is not None:
        good = sum(1 for r in ok if slo.request_ok(r.ttft_ms, r.tpot_ms, r.e2el_ms, r.itl_ms, r.images))
        out["goodput"] = out["request_goodput"] = good / dur
        out["slo_attainment_pct"] = 100.0 * good / len(records) if records else 0.0
    return out


def send_drift(records: Sequence[RequestRecord]) -> dict[str, float]:
    """How far actual send times were from the open-loop schedule (absolute; every request, failed ones too: the
    client's lateness is not the server's), and the schedule's median gap between consecutive requests,
    the scale the drift must be small against. Empty for a closed loop, which has no schedule."""
    timed = [r for r in records if r.scheduled_s is not None]
    if not timed:
        return {}
    lag = [abs(r.start_s - r.scheduled_s) * 1000.0 for r in timed]   # type: ignore[operator]
    d = distribution(lag, "send_drift")
    out = {k: d[k] for k in ("mean_send_drift_ms", "median_send_drift_ms", "p99_send_drift_ms")}
    out["max_send_drift_ms"] = max(lag)
    due = np.sort(np.asarray([r.scheduled_s for r in timed], dtype=float))
    if len(due) > 1:
        out["median_send_gap_ms"] = float(np.median(np.diff(due))) * 1000.0
    return out


def slo_margins(records: Sequence[RequestRecord], slo: SLO) -> dict[str, float]:
    """Measured minus limit per SLO term, counting each failed request as an infinitely slow one, so a
    server that drops requests cannot meet an SLO by dropping its slowest ones. A class term is left out
    when no request of its class was sent (nothing to judge; the other terms decide)."""
    out: dict[str, float] = {}
    for t in slo.terms:
        mine = [r for r in records if t.applies(r.images)]
        if t.cls is not None and not mine:
            continue
        failed = sum(1 for r in mine if not r.ok)
        ok = [r for r in mine if r.ok]
        if t.metric == "itl":
            values = [x for r in ok for x in r.itl_ms]
            extra = 0          # failed requests have no token gaps to add
        else:
            values = [v for r in ok if (v := _value(r, t.metric)) is not None]
            extra = failed
        if not values and not extra:
            out[t.key] = float("inf")
            continue
        arr = np.concatenate([np.asarray(values, dtype=float), np.full(extra, FAILED_MS)])
        stat = float(arr.mean()) if t.percentile is None else float(np.percentile(arr, t.percentile))
        out[t.key] = stat - t.limit_ms
    return out


def _value(r: RequestRecord, metric: str) -> float | None:
    if metric == "ttft":
        return r.ttft_ms
    if metric == "e2el":
        return r.e2el_ms
    return r.tpot_ms
