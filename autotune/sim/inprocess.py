"""The simulator without HTTP: drive the scheduler in simulated time with a synthetic workload.

Search-efficiency benchmarks need hundreds of trials; this runs one in milliseconds to seconds and
reports the same keys `vllm bench serve` (and autotune's bench) report.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.perfmodel.predict import Plan
from autotune.sim.scheduler import Scheduler, SimRequest, SimulatedOOM, prompt_block_hashes


@dataclass
class SimResult:
    metrics: dict[str, float]
    oom: str | None = None                     # runtime OOM message when the engine died
    requests: list[SimRequest] = field(default_factory=list)
    kv_usage_peak: float = 0.0
    preemptions: int = 0


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass(frozen=True)
class ImageMix:
    """The image workload's traffic for the in-process twin: a `share` of requests carry `count`
    (low, high) images, each of one of `sizes`."""

    share: float
    count: tuple[int, int]
    sizes: tuple[tuple[int, int], ...]

    @classmethod
    def from_workload(cls, workload: Any) -> "ImageMix | None":
        """The mix of an image workload (bench/workloads/_image.py), None for any other."""
        if getattr(workload, "kind", None) != "image" or not workload.max_images:
            return None
        return cls(workload.share, workload.count, tuple(workload.sizes))


def summarize(done: list[SimRequest], duration: float) -> dict[str, float]:
    """vllm bench serve's keys; with images, each class's own under `image_` / `text_` as bench reports them."""
    m = _figures(done, duration)
    if any(r.encoder_tokens for r in done):
        for cls, mine in (("image", [r for r in done if r.encoder_tokens]),
                          ("text", [r for r in done if not r.encoder_tokens])):
            if mine:
                m.update({f"{cls}_{k}": v for k, v in _figures(mine, duration).items()})
    return m


def _figures(done: list[SimRequest], duration: float) -> dict[str, float]:
    ttft = [(r.token_times[0] - r.arrival) * 1e3 for r in done if r.token_times]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) * 1e3
            for r in done if len(r.token_times) > 1]
    itl = [float(d) * 1e3 for r in done for d in np.diff(r.token_times)]
    e2el = [(r.token_times[-1] - r.arrival) * 1e3 for r in done if r.token_times]
    out_tokens = sum(r.output_len for r in done)
    in_tokens = sum(r.prompt_len for r in done)
    m: dict[str, float] = {
        "completed": float(len(done)), "failed": 0.0, "duration": duration,
        "total_input_tokens": float(in_tokens), "total_output_tokens": float(out_tokens),
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
    }
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        m[f"mean_{name}_ms"] = float(np.mean(vals)) if vals else float("nan")
        m[f"median_{name}_ms"] = _pct(vals, 50)
        for q in (90, 95, 99):
            m[f"p{q}_{name}_ms"] = _pct(vals, q)
    return m


def run(plan: Plan, *, num_requests: int, input_len: int, output_len: int, concurrency: int | None = None,
        request_rate: float | None = None, seed: int = 0, noise: float = 0.0, warmup: int = 0,
        shared_prefix: int = 0, range_ratio: float = 0.0, images: ImageMix | None = None,
        prefilled: bool = False) -> SimResult:
    """Closed loop at `concurrency` (a new request as soon as one finishes), or Poisson arrivals at
    `request_rate` req/s. The first `warmup` completions are left out of the metrics. Lengths are
    drawn uniformly within +-range_ratio of input_len/output_len (vllm bench's --random-range-ratio);
    `images` adds image tokens and encoder work to a share of the requests (on a VLM profile);
    `prefilled`: every prompt's KV arrives from a prefill instance (the decode side of a PD split), so
    only its last token is computed here."""
    if concurrency is None and request_rate is None:
        raise ValueError("give concurrency or request_rate")
    sched = Scheduler(plan, seed=seed, noise=noise)
    rng = random.Random(seed)
    vision = plan.profile.vision if plan.config.images_enabled else None
    kwargs = plan.config.mm_processor_kwargs
    total = num_requests + warmup
    made = 0

    def new_request(t: float) -> SimRequest:
        nonlocal made
        made += 1
        n_in = max(1, round(input_len * rng.uniform(1 - range_ratio, 1 + range_ratio)))
        n_out = max(1, round(output_len * rng.uniform(1 - range_ratio, 1 + range_ratio)))
        tokens: list[object] = [("p", i) for i in range(min(shared_prefix, n_in))]
        tokens += [(made, i) for i in range(n_in - len(tokens))]
        work: dict[str, Any] = {}
        if vision is not None and images is not None and rng.random() < images.share:
            sizes = [images.sizes[rng.randrange(len(images.sizes))]
                     for _ in range(rng.randint(images.count[0], images.count[1]))]
            image_tokens = sum(vision.tokens(w, h, kwargs) for w, h in sizes)
            tokens += [(made, "img", i) for i in range(image_tokens)]
            n_in += image_tokens
            work = {"encoder_tokens": sum(vision.placeholders(w, h, kwargs) for w, h in sizes),
                    "encoder_flops": sum(vision.flops(vision.patches(w, h, kwargs)) for w, h in sizes)}
        return SimRequest(f"r{made}", n_in, n_out, t, prompt_block_hashes(tokens, plan.config.block_size), **work,
                          remote_cached=n_in - 1 if prefilled else 0)

    arrivals: list[tuple[float, int]] = []
    now = 0.0
    if concurrency is not None:
        for _ in range(min(concurrency, total)):
            sched.add(new_request(0.0))
    else:
        t = 0.0
        for i in range(total):
            t += rng.expovariate(request_rate)  # type: ignore[arg-type]
            heapq.heappush(arrivals, (t, i))
    done: list[SimRequest] = []
    peak = 0.0
    oom = None
    unrefilled: float | None = None     # closed loop: when a finished request was first not replaced
    while len(done) < total:
        while arrivals and arrivals[0][0] <= now:
            t, _ = heapq.heappop(arrivals)
            sched.add(new_request(t))
        try:
            step = sched.schedule()
        except SimulatedOOM as e:
            oom = str(e)
            break
        if step is None:
            if arrivals:
                now = arrivals[0][0]
                continue
            break
        now += step.cost.seconds
        finished = sched.advance(step, now)
        peak = max(peak, sched.kv_usage)
        for r in finished:
            done.append(r)
            if concurrency is not None and made < total:
                sched.add(new_request(now))
            elif concurrency is not None and unrefilled is None:
                unrefilled = now
    measured = done[warmup:]
    first = min((r.arrival for r in measured), default=0.0)
    duration = max((r.token_times[-1] for r in measured), default=first) - first
    metrics = summarize(measured, duration)
    metrics["failed"] = float(total - len(done))
    steady = steady_output_throughput(measured, first, unrefilled)
    if steady is not None:
        metrics["steady_output_throughput"] = steady
    metrics["concurrency"] = float(concurrency or 0)
    metrics["request_rate"] = float(request_rate or 0)
    return SimResult(metrics, oom, measured, peak, sched.preemptions)


def steady_output_throughput(done: list[SimRequest], t0: float, t_end: float | None) -> float | None:
    """Output tokens/s from `t0` until the closed loop first left a finished request unreplaced: the
    twin's side of the real step's fully-loaded window (bench/metrics.steady_output_throughput, which
    capacity_tps reads). A whole-run average counts the drain, where a shrinking batch decodes nearly
    alone, and the twin's steps are short (the study's 64 requests at 56 streams: one wave and 8 more),
    so at 56-159 streams of the H100 decode study it put capacity_tps at 0.56-0.72 of what the real
    search measured with the same TPOT (benchmarks/gpu/knobs, session 26). None without such a moment
    (open loop) or an empty window."""
    if t_end is None or t_end <= t0:
        return None
    tokens = sum(1 for r in done for t in r.token_times if t0 <= t <= t_end)
    return tokens / (t_end - t0)


def summary_row(result: SimResult) -> dict[str, Any]:
    m = result.metrics
    return {"output_tps": round(m["output_throughput"], 1), "p50_ttft_ms": round(m["median_ttft_ms"], 1),
            "p99_ttft_ms": round(m["p99_ttft_ms"], 1), "p50_tpot_ms": round(m["median_tpot_ms"], 2),
            "preemptions": result.preemptions, "kv_peak": round(result.kv_usage_peak, 3), "oom": result.oom}
