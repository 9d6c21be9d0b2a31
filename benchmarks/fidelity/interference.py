#!/usr/bin/env python3
"""Does work on the client's core change the server's speed? The two clients spend different CPU on
core 1 (vllm bench serve 2-3x autotune's, in pass-a/pass-b.json) while the server runs pinned to core 0.
If CPU load on core 1 slows a server confined to core 0 (shared caches, memory bandwidth, or host cores
that the VM's two vCPUs share), then a client's own appetite changes what it measures, and the gaps in
RESULTS.md are partly the clients' CPU, not their timing.

One server pinned to core 0; autotune's client on core 1 runs one cell again and again while a spinner
on core 1 holds a duty cycle of 0, 50 or 100 % (ABC CBA order, repeated). The server's own counters
(/metrics: its TTFT and time-per-output-token histograms) say how fast the server was, whatever the
spinner did to the client.

    .venv/bin/python benchmarks/fidelity/interference.py --cell "32/128 c=1" --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from diagnose import COUNTERS, scrape  # noqa: E402
from fidelity import cell_name, grid  # noqa: E402
from bench_vs_vllm import parse_pin, pinned, reset_prefix_cache, run_ours, start_vllm, stop_vllm  # noqa: E402

SPIN = ("import time, sys\n"
        "duty = float(sys.argv[1]); period = 0.01\n"
        "while True:\n"
        "    end = time.perf_counter() + duty * period\n"
        "    while time.perf_counter() < end: pass\n"
        "    time.sleep((1 - duty) * period)\n")


def spinner(duty: float, cpus: str) -> subprocess.Popen | None:
    """A busy loop holding `duty` of a core, in its own process group (stopped by its id)."""
    if duty <= 0:
        return None
    return subprocess.Popen(pinned([sys.executable, "-c", SPIN, str(duty)], cpus), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="32/128 c=1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duties", default="0,0.5,1")
    ap.add_argument("--pin", default="0:1")
    ap.add_argument("--port", type=int, default=18813)
    ap.add_argument("--out", default=str(HERE / "interference.json"))
    a = ap.parse_args()
    cell = next(c for c in grid() if cell_name(c) == a.cell)
    duties = [float(x) for x in a.duties.split(",")]
    server_cpus, client_cpus = parse_pin(a.pin)
    url = f"http://127.0.0.1:{a.port}"
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        server = start_vllm(a.port, tmp / "vllm.log", no_cache=True, cpus=server_cpus)
        try:
            run_ours(url, cell, tmp / "discard.json", client_cpus)
            for r in range(a.rounds):
                for duty in (duties if r % 2 == 0 else duties[::-1]):
                    reset_prefix_cache(url)
                    spin = spinner(duty, client_cpus)
                    try:
                        time.sleep(0.5)
                        before = scrape(url)
                        x = run_ours(url, cell, tmp / f"r{r}-{duty}.json", client_cpus)
                        time.sleep(1)
                        after = scrape(url)
                    finally:
                        stop(spin)
                    d = {k: after[k] - before[k] for k in COUNTERS}
                    row = {"round": r, "spin_duty": duty,
                           "server_mean_ttft_ms": 1000 * d["ttft_sum"] / (d["ttft_count"] or 1),
                           "server_mean_tpot_ms": 1000 * d["tpot_sum"] / (d["tpot_count"] or 1),
                           "server_mean_itl_ms": 1000 * d["itl_sum"] / (d["itl_count"] or 1),
                           "client_mean_ttft_ms": x["mean_ttft_ms"], "client_mean_tpot_ms": x["mean_tpot_ms"],
                           "client_output_throughput": x["output_throughput"]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            stop_vllm(server)
    Path(a.out).write_text(json.dumps({"cell": a.cell, "started": started,
                                       "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                       "pin": {"server_cpus": server_cpus, "client_and_spinner_cpus": client_cpus},
                                       "note": "server counters include the client's warm-up requests",
                                       "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
