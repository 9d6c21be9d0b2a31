#!/usr/bin/env python3
"""Why a fidelity cell differs: the server's own counters (`/metrics`: prompt and generated tokens,
requests, and vLLM's server-side TTFT and time-per-output-token histograms) read before and after each
client's run, so the two clients' requests can be compared by what the server saw and how long the server
says they took, not by what each client reports.

    .venv/bin/python benchmarks/fidelity/diagnose.py --cell "32/128 c=1" --pairs 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fidelity import cell_name, counted, grid, server_means  # noqa: E402
from bench_vs_vllm import parse_pin, reset_prefix_cache, run_ours, run_theirs, start_vllm, stop_vllm  # noqa: E402

@contextlib.contextmanager
def pinned_server(port: int, server_cpus: str, warm: Callable[[Path], object]) -> Iterator[Path]:
    """A vLLM server pinned to `server_cpus`, warmed by one discarded run (`warm(path)`), stopped by its
    process group on the way out; yields a scratch folder for the runs' JSON."""
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        server = start_vllm(port, tmp / "vllm.log", no_cache=True, cpus=server_cpus)
        try:
            warm(tmp / "discard.json")
            yield tmp
        finally:
            stop_vllm(server)


def counted_run(url: str, run: Callable[[], dict]) -> tuple[dict, dict[str, float]]:
    """One client run on a reset prefix cache, and the change of the server's own counters over it."""
    reset_prefix_cache(url)
    x, d, _ = counted(url, run)
    return x, d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", required=True)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--pin", default="0:1")
    ap.add_argument("--port", type=int, default=18812)
    ap.add_argument("--out", default=str(HERE / "diagnose.json"))
    a = ap.parse_args()
    cell = next(c for c in grid() if cell_name(c) == a.cell)
    server_cpus, client_cpus = parse_pin(a.pin)
    url = f"http://127.0.0.1:{a.port}"
    rows = []
    with pinned_server(a.port, server_cpus, lambda out: run_theirs(url, cell, out, client_cpus)) as tmp:
        for i in range(a.pairs):
            for name, fn in ((("autotune", run_ours), ("vllm", run_theirs)) if i % 2 == 0
                             else (("vllm", run_theirs), ("autotune", run_ours))):
                x, d = counted_run(url, lambda: fn(url, cell, tmp / f"{name}{i}.json", client_cpus))
                n = d["requests"] or 1
                row = {"client": name, "pair": i, "server_requests": d["requests"],
                       "server_prompt_tokens_per_request": d["prompt_tokens"] / n,
                       "server_generated_tokens_per_request": d["generation_tokens"] / n, **server_means(d),
                       "client_total_input_tokens": x.get("total_input_tokens"),
                       "client_completed": x.get("completed"),
                       "client_mean_ttft_ms": x["mean_ttft_ms"], "client_mean_tpot_ms": x["mean_tpot_ms"],
                       "client_output_throughput": x["output_throughput"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(a.out).write_text(json.dumps({"cell": a.cell, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                       "note": "server counters include each client's warm-up requests",
                                       "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
