#!/usr/bin/env python3
"""Trace replay: how far actual send times drift from a trace's schedule, by shape of burst.

The server is autotune.bench.mockserver (`stream`, 16 tokens a request, 1 ms apart) in its own process,
so the client's event loop carries only the client. Each shape is a canonical trace written here and
replayed by `run_load` at time_scale 1; the drift is every request's |actual - scheduled| send time as
the client records it (metrics.send_drift).

    .venv/bin/python benchmarks/replay_drift.py [--out benchmarks/replay_drift_results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autotune.bench import parse_workload, run_load  # noqa: E402
from autotune.engine.process import find_free_port  # noqa: E402

SHAPES = {   # name -> (arrival times in s)
    "8-request bursts, 50 ms apart, every 0.6 s": [b * 0.6 + k * 0.05 for b in range(10) for k in range(8)],
    "32-request bursts, 5 ms apart, every 1 s": [b * 1.0 + k * 0.005 for b in range(5) for k in range(32)],
    "64 requests at one instant, every 1 s": [b * 1.0 for b in range(4) for _ in range(64)],
    "Poisson 200 req/s for 4 s": list(np.cumsum(np.random.default_rng(0).exponential(1 / 200, 800))),
}


def start_server(port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "autotune.bench.mockserver", "--port", str(port), "--mode", "stream",
                          "--itl-ms", "1"], cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
            return p
        except OSError:
            time.sleep(0.05)
    os.killpg(p.pid, signal.SIGTERM)
    raise RuntimeError("mock server did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "replay_drift_results.json"))
    args = ap.parse_args()
    port = find_free_port()
    server = start_server(port)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, times in SHAPES.items():
                path = Path(tmp) / "trace.jsonl"
                path.write_text("".join(json.dumps({"t": float(t), "output_tokens": 16, "input_tokens": 32}) + "\n"
                                        for t in sorted(times)))
                load0 = os.getloadavg()[0]
                m = asyncio.run(run_load(f"http://127.0.0.1:{port}", "mock", parse_workload(f"trace:path={path}")))
                x = m.metrics
                rows.append({"shape": name, "requests": int(x["completed"]), "load_avg_1m_before": load0,
                             **{k: round(x[k], 3) for k in ("median_send_drift_ms", "p99_send_drift_ms",
                                                            "max_send_drift_ms", "median_send_gap_ms")},
                             "client_saturated": m.client.saturated, "client_note": m.client.note})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    Path(args.out).write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(),
                                          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                          "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
