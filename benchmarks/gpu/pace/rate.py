#!/usr/bin/env python3
"""Trials per GPU-hour of an 8B study on the H200, before and after (issue 12, item 6), from the study DBs.

A trial's GPU time is its own wall clock (started to finished, in the DB's clock): the gaps between
device calls, when no trial ran, are left out of both runs alike. "Launched" trials started a server
(measured, early-stopped, or failed after a launch); "measured" counts the ones measured to the end;
candidates rejected before a launch (a learned limit, a flag rule,
a duplicate) cost no GPU time and are counted apart. Startup is autotune's launch-to-ready time; load is
the rest of the trial (capacity search, telemetry, stopping the server).

    python3 benchmarks/gpu/pace/rate.py benchmarks/gpu/h200-llama8b.db benchmarks/gpu/pace/pace.db:63
    python3 benchmarks/gpu/pace/rate.py benchmarks/gpu/h200-llama8b.db benchmarks/gpu/pace2/pace2.db

`DB:S` adds S seconds of GPU time held outside any trial (the after run's twin ranked its warm-start
candidates for 63 s before the first launch, device/pace-c1.log: the GPU was held and idle).
(the committed DBs are gzipped: `gunzip -k benchmarks/gpu/pace*/*.db.gz` first)
"""

from __future__ import annotations

import json
import sqlite3
import sys
from datetime import datetime
from statistics import median

NOT_LAUNCHED = ("constraint", "duplicate", "predicted_oom")


def rows(path: str) -> list[dict]:
    with sqlite3.connect(path) as c:
        c.row_factory = sqlite3.Row
        out = []
        for r in c.execute("select number, role, state, cause, started_at, finished_at, startup_seconds, "
                           "startup, capacity from autotune_trials order by number"):
            d = dict(r)
            t0, t1 = (datetime.fromisoformat(d[k]) if d[k] else None for k in ("started_at", "finished_at"))
            d["wall"] = (t1 - t0).total_seconds() if t0 and t1 else None
            start = json.loads(d["startup"]) if d["startup"] else {}
            d["phases"] = start.get("phases") if isinstance(start, dict) else None
            cap = json.loads(d["capacity"]) if d["capacity"] else {}
            d["steps"] = len(cap.get("steps", [])) if isinstance(cap, dict) else 0
            d["broken"] = sum(not st.get("slo_met") for st in cap.get("steps", [])) if isinstance(cap, dict) else 0
            d["cap"] = cap.get("capacity") if isinstance(cap, dict) else None
            out.append(d)
        return out


def summary(arg: str) -> dict:
    path, _, extra = arg.partition(":")
    rs = rows(path)
    launched = [r for r in rs if r["cause"] not in NOT_LAUNCHED
                and r["state"] in ("ok", "failed", "interrupted", "stopped")]   # stopped: early-stopped
    ok = [r for r in launched if r["state"] == "ok"]
    gpu_s = sum(r["wall"] or 0 for r in launched) + float(extra or 0)
    return {"db": arg, "trials": len(rs), "launched": len(launched), "measured": len(ok),
            "not_launched": len(rs) - len(launched), "interrupted": sum(r["state"] == "interrupted" for r in rs),
            "early_stopped": sum(r["state"] == "stopped" for r in rs),
            "gpu_s": gpu_s, "launched_per_h": 3600 * len(launched) / gpu_s, "measured_per_h": 3600 * len(ok) / gpu_s,
            "median_wall_ok": median(r["wall"] for r in ok),
            "median_startup_ok": median(r["startup_seconds"] for r in ok),
            "median_load_ok": median(r["wall"] - r["startup_seconds"] for r in ok),
            "median_steps_ok": median(r["steps"] for r in ok),
            "median_broken_ok": median(r["broken"] for r in ok), "rows": rs}


def main() -> None:
    sums = [summary(p) for p in sys.argv[1:]]
    print("| study DB[:extra s] | trials | launched | measured | not launched | GPU s (launched walls + extra) | launched / GPU-h "
          "| measured / GPU-h | median wall s (measured) | median startup s | median load s | median steps "
          "| median broken steps |")
    print("|---|" + "---|" * 12)
    for s in sums:
        print(f"| {s['db']} | {s['trials']} | {s['launched']} ({s['interrupted']} interrupted, "
              f"{s['early_stopped']} early-stopped) | {s['measured']} "
              f"| {s['not_launched']} | {s['gpu_s']:.0f} | {s['launched_per_h']:.1f} | {s['measured_per_h']:.1f} "
              f"| {s['median_wall_ok']:.0f} | {s['median_startup_ok']:.0f} | {s['median_load_ok']:.0f} "
              f"| {s['median_steps_ok']:g} | {s['median_broken_ok']:g} |")
    if len(sums) == 2:
        a, b = sums
        print(f"\nafter / before: launched per GPU-h x{b['launched_per_h'] / a['launched_per_h']:.2f}, "
              f"measured per GPU-h x{b['measured_per_h'] / a['measured_per_h']:.2f}")
    for s in sums:
        print(f"\n{s['db'].partition(':')[0]}: per trial")
        print("| # | role | state | cause | wall s | startup s | load s | steps | broken | capacity | "
              "process_imports | weights | compile | kv_profiling | cuda_graphs | other |")
        print("|---|" + "---|" * 15)
        for r in s["rows"]:
            ph = r["phases"] or {}
            load = r["wall"] - r["startup_seconds"] if r["wall"] is not None and r["startup_seconds"] else None
            cells = [r["number"], r["role"], r["state"], r["cause"] or "", f"{r['wall']:.0f}" if r["wall"] is not None else "",
                     f"{r['startup_seconds']:.0f}" if r["startup_seconds"] else "", f"{load:.0f}" if load is not None else "",
                     r["steps"] or "", r["broken"] if r["steps"] else "", f"{r['cap']:g}" if r["cap"] else "",
                     *(f"{ph[k]:g}" if k in ph else "-" for k in ("process_imports", "weights", "compile",
                                                                  "kv_profiling", "cuda_graphs", "other"))]
            print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
