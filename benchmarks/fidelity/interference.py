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
    .venv/bin/python benchmarks/fidelity/interference.py --cell "256/128 c=16" --kind memory --duties 0,0.6
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from diagnose import counted_run, pinned_server, server_means  # noqa: E402
from fidelity import cell_name, grid  # noqa: E402
from bench_vs_vllm import parse_pin, pinned, run_ours  # noqa: E402

SPIN = ("import time, sys\n"
        "duty = float(sys.argv[1]); period = 0.01\n"
        "while True:\n"
        "    end = time.perf_counter() + duty * period\n"
        "    while time.perf_counter() < end: pass\n"
        "    time.sleep((1 - duty) * period)\n")

# the same duty cycle spent copying through 2 x 48 MiB (more than the 32 MiB L3 the vCPUs share): a load on
# caches and memory bandwidth as well as on the core, which a pure busy loop is not
SPIN_MEMORY = ("import time, sys\n"
               "duty = float(sys.argv[1]); period = 0.01\n"
               "a = memoryview(bytearray(48 << 20)); b = memoryview(bytearray(48 << 20))\n"
               "n, step, i = len(a), 1 << 20, 0\n"
               "while True:\n"
               "    end = time.perf_counter() + duty * period\n"
               "    while time.perf_counter() < end:\n"
               "        b[i:i + step] = a[i:i + step]; i = (i + step) % n\n"
               "    time.sleep((1 - duty) * period)\n")


def spinner(duty: float, cpus: str, kind: str = "cpu") -> subprocess.Popen | None:
    """A busy loop holding `duty` of a core, in its own process group (stopped by its id)."""
    if duty <= 0:
        return None
    code = SPIN_MEMORY if kind == "memory" else SPIN
    return subprocess.Popen(pinned([sys.executable, "-c", code, str(duty)], cpus), start_new_session=True,
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
    ap.add_argument("--kind", choices=("cpu", "memory"), default="cpu",
                    help="what the spinner does with its duty: a busy loop, or memory copies past the L3")
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
    with pinned_server(a.port, server_cpus, lambda out: run_ours(url, cell, out, client_cpus)) as tmp:
        for r in range(a.rounds):
            for duty in (duties if r % 2 == 0 else duties[::-1]):
                spin = spinner(duty, client_cpus, a.kind)
                try:
                    time.sleep(0.5)
                    x, d = counted_run(url, lambda: run_ours(url, cell, tmp / f"r{r}-{duty}.json", client_cpus))
                finally:
                    stop(spin)
                row = {"round": r, "spin_duty": duty, "spin_kind": a.kind, **server_means(d),
                       "client_mean_ttft_ms": x["mean_ttft_ms"], "client_mean_tpot_ms": x["mean_tpot_ms"],
                       "client_output_throughput": x["output_throughput"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps({"cell": a.cell, "started": started,
                                       "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                       "pin": {"server_cpus": server_cpus, "client_and_spinner_cpus": client_cpus},
                                       "note": "server counters include the client's warm-up requests",
                                       "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
