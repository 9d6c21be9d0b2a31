#!/usr/bin/env python3
"""Whole-run vs. steady output throughput against a server of known speed, across step lengths.

The mock server (`autotune.bench.mockserver --mode batch`) runs continuous batching: every step emits
one token per running sequence and takes `step_ms + per_seq_ms x batch`. At 40 closed-loop streams the
server's own rate is 40 / (2 + 0.25 x 40) ms = 3,333 tok/s (less the refill gap: a finished stream's
next request joins at the next step). A capacity step of N requests is 1.1 to 4 waves; the figure a
tuner ranks should not move with where the last partial wave falls.

    .venv/bin/python benchmarks/steady_throughput.py [--repeats 3] [--out benchmarks/steady_throughput_results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from statistics import median

from autotune.bench import parse_workload, run_load
from autotune.bench.mockserver import MockConfig, build_app, serve

STREAMS, STEP_MS, PER_SEQ_MS = 40, 2.0, 0.25
TRUTH = STREAMS / ((STEP_MS + PER_SEQ_MS * STREAMS) / 1000.0)


async def one(n: int) -> dict[str, float]:
    async with serve(build_app(MockConfig(mode="batch", step_ms=STEP_MS, per_seq_ms=PER_SEQ_MS))) as url:
        m = await run_load(url, "mock", parse_workload("random:input_len=20,output_len=64"),
                           concurrency=STREAMS, num_requests=n)
    return {"whole_run": m.metrics["output_throughput"], "steady": m.metrics["steady_output_throughput"]}


async def main(repeats: int, out: Path) -> None:
    rows = []
    load_before = os.getloadavg()[0]
    for n in (44, 60, 80, 100, 120, 160):
        runs = [await one(n) for _ in range(repeats)]
        rows.append({"requests": n, "waves": n / STREAMS, "whole_run": median(r["whole_run"] for r in runs),
                     "steady": median(r["steady"] for r in runs), "runs": runs})
        print(f"{n:4d} requests ({n / STREAMS:.1f} waves): whole-run {rows[-1]['whole_run']:7.0f}  "
              f"steady {rows[-1]['steady']:7.0f}  tok/s  (server's rate {TRUTH:.0f})")
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "load_avg_before_after": [load_before, os.getloadavg()[0]], "truth_tok_s": TRUTH,
           "streams": STREAMS, "rows": rows}
    for key in ("whole_run", "steady"):
        vals = [r[key] for r in rows]
        doc[f"{key}_spread_pct"] = (max(vals) / min(vals) - 1) * 100
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"spread across step lengths: whole-run {doc['whole_run_spread_pct']:.1f} %, "
          f"steady {doc['steady_spread_pct']:.1f} %")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("steady_throughput_results.json"))
    a = ap.parse_args()
    asyncio.run(main(a.repeats, a.out))
