#!/usr/bin/env python3
"""Capacity search against a server whose capacity is known: autotune.bench.mockserver in `batch` mode
(its own process), a continuous-batching scheduler whose step takes STEP_MS + PER_SEQ_MS * batch.

Truth:
- concurrency: at a steady batch n, TPOT = STEP_MS + PER_SEQ_MS * n, so the highest n meeting
  `tpot:p50<=LIMIT` is floor((LIMIT - STEP_MS) / PER_SEQ_MS), known before any request is sent.
- rate: under Poisson arrivals the batch size is random and a 200-request step starts from an idle
  server, so the answer depends on the protocol; the truth is the rate at which a step of the same
  protocol has median TPOT at the limit, computed by a virtual-time simulation of the same scheduler
  (no HTTP, no client, 400 seeds per rate, bisection). The server's hard service limit 1/(O*PER_SEQ_MS)
  is reported beside it.

    .venv/bin/python benchmarks/capacity_search.py [--out benchmarks/capacity_search_results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.bench import find_capacity, parse_workload  # noqa: E402
from autotune.slo import SLO  # noqa: E402

STEP_MS, PER_SEQ_MS, OUT = 5.0, 0.5, 32
WORKLOAD = f"random:input_len=32,output_len={OUT}"


def start_server(port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "autotune.bench.mockserver", "--port", str(port), "--mode", "batch",
                          "--step-ms", str(STEP_MS), "--per-seq-ms", str(PER_SEQ_MS), "--max-seqs", "4096"],
                         cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("mock server did not start")


def simulate_step_tpot_p50(rate: float, n: int, seed: int) -> float:
    """Median TPOT of one n-request Poisson step from an idle server, in virtual time (the mock's
    scheduler: admit at step start, one token per running sequence at step end)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n - 1)
    gaps *= (n - 1) / rate / gaps.sum()             # as OpenLoop(exact_n=n) offers them
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)])
    t, i = 0.0, 0
    running: list[list[float]] = []        # [remaining, first_token_time]
    tpots = []
    while i < n or running:
        if not running and i < n and arrivals[i] > t:
            t = arrivals[i]
        while i < n and arrivals[i] <= t:
            running.append([OUT, -1.0])
            i += 1
        t += (STEP_MS + PER_SEQ_MS * len(running)) / 1000.0
        still = []
        for s in running:
            s[0] -= 1
            if s[1] < 0:
                s[1] = t
            if s[0] == 0:
                tpots.append((t - s[1]) * 1000.0 / (OUT - 1))
            else:
                still.append(s)
        running = still
    return float(np.median(tpots))


def rate_truth(limit_ms: float, n: int, seeds: int = 400) -> float:
    lo, hi = 1.0, 1000.0 / (OUT * PER_SEQ_MS)   # the hard service limit
    for _ in range(30):
        mid = (lo + hi) / 2
        if np.mean([simulate_step_tpot_p50(mid, n, s) for s in range(seeds)]) <= limit_ms:
            lo = mid
        else:
            hi = mid
    return lo


async def search(url: str, mode: str, limit_ms: float, n: int) -> dict:
    steps = []
    r = await find_capacity(url, "mock", parse_workload(WORKLOAD), SLO.parse(f"tpot:p50<={limit_ms}ms"),
                            search=mode, requests_per_step=n, warmup=16, seed=0,
                            on_step=lambda s: steps.append({
                                "load": s.load, "slo_met": s.slo_met, "aborted_early": s.measurement.aborted_early,
                                "completed": s.measurement.metrics["completed"],
                                "median_tpot_ms": s.measurement.metrics.get("median_tpot_ms"),
                                "output_throughput": s.measurement.metrics["output_throughput"],
                                "client_saturated": s.measurement.client.saturated}))
    return {"capacity": r.capacity, "steps": steps, "n_steps": len(steps), "note": r.note,
            "capacity_tps": r.at_capacity.metrics["output_throughput"] if r.at_capacity else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "capacity_search_results.json"))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    n = 200
    conc_limit = STEP_MS + PER_SEQ_MS * 40.5          # truth 40
    rate_limit = 25.0
    truths = {"concurrency": math.floor((conc_limit - STEP_MS) / PER_SEQ_MS), "rate": rate_truth(rate_limit, n)}
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": f"{platform.node()} {os.cpu_count()} cores",
               "load_avg_before": os.getloadavg(), "server": {"step_ms": STEP_MS, "per_seq_ms": PER_SEQ_MS,
                                                             "output_len": OUT, "workload": WORKLOAD},
               "service_limit_req_s": 1000.0 / (OUT * PER_SEQ_MS), "requests_per_step": n, "runs": []}
    server = start_server(18790)
    try:
        for rep in range(a.repeats):
            for mode, limit in (("concurrency", conc_limit), ("rate", rate_limit)):
                t0 = time.perf_counter()
                res = asyncio.run(search("http://127.0.0.1:18790", mode, limit, n))
                res.update({"mode": mode, "slo": f"tpot:p50<={limit}ms", "truth": truths[mode], "repeat": rep,
                            "wall_s": round(time.perf_counter() - t0, 1),
                            "error_pct": None if res["capacity"] is None else
                            round(100 * (res["capacity"] - truths[mode]) / truths[mode], 2)})
                results["runs"].append(res)
                print(json.dumps({k: res[k] for k in ("mode", "truth", "capacity", "error_pct", "n_steps", "wall_s")}),
                      flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    results["load_avg_after"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
