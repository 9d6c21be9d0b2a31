"""The twin's own capacity under an SLO: closed-loop steps from one stream upward by x4 until the SLO
breaks (or the simulated engine dies), then bisection to the crossing. Used by the warm start to rank
candidates before any launch and by the search benchmark to compute its landscapes (simulated)."""

from __future__ import annotations

from typing import Any

from autotune.bench.metrics import capacity_tps
from autotune.perfmodel.predict import Plan
from autotune.sim.inprocess import ImageMix, run as sim_run
from autotune.slo import SLO

MAX_CONCURRENCY = 1024
PROBE_REQUESTS = 20


def step(plan: Plan, c: int, input_len: int, output_len: int, requests: int, seed: int = 0,
         images: ImageMix | None = None) -> dict[str, Any]:
    """One closed-loop step at concurrency c: at least c requests (PROBE_REQUESTS at one stream), the
    first wave counted. At least c: a step that sent `requests` in all (the study's requests per step,
    at most 96) never ran more streams than that at once, and on a decode-heavy study (64 a step) the
    twin predicted 7,639 tok/s at its cap of 1,024 streams, the same figure at 64, 256 and 1,024, where
    an H100 measured 16,636 at 343 (benchmarks/gpu/knobs, session 25); now 444 streams, 21,698 tok/s.
    The first wave stays counted, unlike the real search's (bench/capacity.step_requests): the twin's
    steady state queues prompts far less than a real server does, and counted after a settle wave its
    TTFT-bound capacity on the H200 chat study came out at 714 streams against the 35 measured (48 with
    the first wave's queueing in it)."""
    r = sim_run(plan, num_requests=PROBE_REQUESTS if c == 1 else max(requests, c), input_len=input_len,
                output_len=output_len, concurrency=c, seed=seed, images=images)
    m = r.metrics
    return {"c": c, "tps": round(capacity_tps(m) or 0.0, 2), "ttft99": round(m["p99_ttft_ms"], 2),
            "tpot50": round(m["median_tpot_ms"], 4), "metrics": m, "oom": r.oom is not None}


def capacity_curve(plan: Plan, slo: SLO, input_len: int, output_len: int, requests: int = 160,
                   seed: int = 0, images: ImageMix | None = None) -> list[dict[str, Any]]:
    """Every step taken, sorted by concurrency; `meets` on each says whether the SLO held there."""
    pts: dict[int, dict[str, Any]] = {}

    def ok(c: int) -> bool:
        if c not in pts:
            s = step(plan, c, input_len, output_len, requests, seed, images)
            s["meets"] = not s["oom"] and slo.met(s.pop("metrics"))
            pts[c] = s
        return bool(pts[c]["meets"])

    lo, hi, c = 0, None, 1
    while c <= MAX_CONCURRENCY:
        if ok(c):
            lo, c = c, c * 4
        else:
            hi = c
            break
    if hi is not None and lo > 0:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
    return [pts[k] for k in sorted(pts)]


def at_capacity(curve: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest step that met the SLO below the lowest that broke it; None if the probe broke it."""
    broken = [p["c"] for p in curve if not p["meets"]]
    top = min(broken) if broken else float("inf")
    met = [p for p in curve if p["meets"] and p["c"] < top]
    return max(met, key=lambda p: p["c"]) if met else None
