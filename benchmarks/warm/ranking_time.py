#!/usr/bin/env python3
"""How long the warm start's twin ranking takes: in one thread of the tuner (as it ran until issue 22),
in worker processes on N cores (tuner/twin_pool.py) at normal priority and at nice 19 (as the tuner runs
them: on a busy host they get what the rest leaves), and from the cache a second study finds
(tuner/twin_cache.py). SIMULATED predictions (the in-process twin); the times are this machine's CPU.

    .venv/bin/python benchmarks/warm/ranking_time.py [--candidates 200] [--workers 2] [--json OUT]

The scenario is the issue's: an 8B model (the `llama-3.1-8b` profile) on one H200, long prompts
(4,096 in / 256 out), p99 TTFT <= 1 s and p50 TPOT <= 50 ms, the default search space.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.slo import SLO  # noqa: E402
from autotune.space import SearchSpace  # noqa: E402
from autotune.tuner.twin_cache import RankingCache  # noqa: E402
from autotune.tuner.twin_pool import TwinJob, TwinPool  # noqa: E402
from autotune.tuner.warmstart import draw_candidates  # noqa: E402

FIXED = ("--max-model-len", "8192")
WORKLOAD = {"kind": "random", "input_len": 4096, "output_len": 256}
SLO_TEXT = "ttft:p99<=1s,tpot:p50<=50ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=str(Path(__file__).resolve().parent / "ranking_time.json"))
    args = ap.parse_args()
    space = SearchSpace.load("default").narrowed(1, False)
    job = TwinJob("llama-3.1-8b", "H200", 1, FIXED, space, WORKLOAD, SLO.parse(SLO_TEXT), requests=96)
    cands = draw_candidates(space, list(FIXED), 1, args.candidates, seed=0)
    out: dict[str, object] = {"command": " ".join(["benchmarks/warm/ranking_time.py", *sys.argv[1:]]),
                              "machine": f"{platform.node()}, {os.cpu_count()} cores (shared with other jobs), "
                                         f"load average {os.getloadavg()[0]:.1f} at the start",
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "simulated": True,
                              "candidates": len(cands), "workload": WORKLOAD, "slo": SLO_TEXT}

    t0 = time.monotonic()
    predict = job.predictor()
    assert predict is not None
    predicted = [predict(c) for c in cands]
    out["one_thread_s"] = round(time.monotonic() - t0, 1)
    print(f"one thread: {out['one_thread_s']} s", flush=True)

    for nice in (0, 19):      # 19: as the tuner runs them (they yield to everything else on the host)
        t0 = time.monotonic()
        pool = TwinPool(job, cands, cores=sorted(os.sched_getaffinity(0)), workers=args.workers, nice=nice).start()
        assert pool.wait(3600) and not pool.error
        out["processes"] = pool.processes
        out[f"processes_nice{nice}_s"] = round(time.monotonic() - t0, 1)
        assert [pool.results()[i] for i in range(len(cands))] == predicted    # the same predictions
        print(f"{pool.processes} processes at nice {nice}: {out[f'processes_nice{nice}_s']} s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        cache = RankingCache(Path(tmp), job)
        cache.save({cache.key(c): p for c, p in zip(cands, predicted)})
        t0 = time.monotonic()
        again = RankingCache(Path(tmp), job).load()
        hits = [again.get(cache.key(c)) for c in cands]
        out["from_cache_s"] = round(time.monotonic() - t0, 3)
        assert hits == predicted
    print(f"from the cache: {out['from_cache_s']} s", flush=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
