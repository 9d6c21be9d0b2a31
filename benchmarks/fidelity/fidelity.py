#!/usr/bin/env python3
"""The fidelity matrix: `autotune bench` beside `vllm bench serve` over a grid of prompt lengths, output
lengths and concurrencies (1 to the server's batch limit) plus one open-loop rate row, on the vLLM CPU
build with the demo model. One pass starts one server and measures every cell in ABBA order (A = autotune,
B = vLLM's client; the order flips every pair so that a machine drifting slower costs both alike), with
the prefix cache off and reset before every run. Run it twice at different times: a gap that shows in
one pass only is the machine's drift, not a client's.

The server and the clients are pinned apart (`--pin 0:1`, as `bench_vs_vllm.py --pin` explains): on two
shared cores a client that costs more CPU would otherwise slow the server it measures.

    .venv/bin/python benchmarks/fidelity/fidelity.py --pass-name a      # one pass -> pass-a.json
    .venv/bin/python benchmarks/fidelity/fidelity.py --table            # RESULTS table from every pass
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import mean, median
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench_vs_vllm import (MODEL, _children_cpu_s, parse_pin, reset_prefix_cache, run_ours,  # noqa: E402
                           run_theirs, start_vllm, stop_vllm, tree_cpu_s)

KEYS = ("median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "mean_tpot_ms", "output_throughput")
MAX_MODEL_LEN = 1024    # start_vllm's --max-model-len; the longest prompt leaves room for its output
BATCH_LIMIT = 16        # start_vllm's --max-num-seqs: concurrency 16 is the server's saturation
# vLLM's own counters and server-side histograms: what the server saw and how long it says it took
COUNTERS = {"prompt_tokens": "vllm:prompt_tokens_total", "generation_tokens": "vllm:generation_tokens_total",
            "requests": "vllm:request_success_total",
            "ttft_sum": "vllm:time_to_first_token_seconds_sum", "ttft_count": "vllm:time_to_first_token_seconds_count",
            "tpot_sum": "vllm:request_time_per_output_token_seconds_sum",
            "tpot_count": "vllm:request_time_per_output_token_seconds_count",
            "itl_sum": "vllm:inter_token_latency_seconds_sum", "itl_count": "vllm:inter_token_latency_seconds_count",
            "queue_sum": "vllm:request_queue_time_seconds_sum", "queue_count": "vllm:request_queue_time_seconds_count",
            "prefill_sum": "vllm:request_prefill_time_seconds_sum",
            "prefill_count": "vllm:request_prefill_time_seconds_count",
            "steps": "vllm:iteration_tokens_total_count", "step_tokens": "vllm:iteration_tokens_total_sum"}


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = {}
    for key, name in COUNTERS.items():
        total = 0.0
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M):
            total += float(m.group(1))
        out[key] = total
    return out


def counted(url: str, run: Callable[[], dict]) -> tuple[dict, dict[str, float], float]:
    """One client run, the change of the server's own counters over it (read one second after, so that
    the last request's histogram samples are in) and the run's wall time."""
    before = scrape(url)
    t0 = time.monotonic()
    x = run()
    wall = time.monotonic() - t0
    time.sleep(1)
    after = scrape(url)
    return x, {k: after[k] - before[k] for k in COUNTERS}, wall


def server_means(d: dict[str, float]) -> dict[str, float]:
    """The server's mean TTFT, TPOT and ITL (ms) over a counter change (the run's requests, its warm-up
    included: both clients send a warm-up of the cell's size)."""
    return {"server_mean_ttft_ms": 1000 * d["ttft_sum"] / (d["ttft_count"] or 1),
            "server_mean_tpot_ms": 1000 * d["tpot_sum"] / (d["tpot_count"] or 1),
            "server_mean_itl_ms": 1000 * d["itl_sum"] / (d["itl_count"] or 1),
            "server_mean_queue_ms": 1000 * d["queue_sum"] / (d["queue_count"] or 1),
            "server_mean_prefill_ms": 1000 * d["prefill_sum"] / (d["prefill_count"] or 1),
            "server_engine_steps": d["steps"], "server_tokens_per_step": d["step_tokens"] / (d["steps"] or 1),
            "server_requests": d["requests"],
            "server_generated_tokens_per_request": d["generation_tokens"] / (d["requests"] or 1)}


def grid() -> list[dict]:
    """Prompt lengths short / medium / near the model's limit, outputs short / long, concurrency 1 and the
    batch limit on every pair, a middle concurrency on one pair, and one Poisson-rate row. Request counts
    keep each measured run near 5-25 s on one pinned core (pass a used a third of them: 1.5-13 s runs,
    whose run-to-run spread was as large as the gaps it was meant to find)."""
    cells = []
    for inp in (32, 256, 880):
        for out in (16, 128):
            for conc in (1, BATCH_LIMIT):
                n = (72 if out == 16 else 30) if conc == 1 else (288 if out == 16 else 144)
                cells.append({"input_len": inp, "output_len": out, "concurrency": conc, "rate": None,
                              "num_requests": n, "warmup": max(2, conc)})
    cells.append({"input_len": 256, "output_len": 128, "concurrency": 4, "rate": None, "num_requests": 72,
                  "warmup": 4})
    cells.append({"input_len": 256, "output_len": 128, "concurrency": None, "rate": 4.0, "num_requests": 96,
                  "warmup": 2})
    for c in cells:
        assert c["input_len"] + c["output_len"] <= MAX_MODEL_LEN
    return cells


def cell_name(c: dict) -> str:
    load = f"c={c['concurrency']}" if c["rate"] is None else f"rate={c['rate']:g}/s"
    return f"{c['input_len']}/{c['output_len']} {load}"


def run_pass(a: argparse.Namespace) -> Path:
    server_cpus, client_cpus = parse_pin(a.pin) if a.pin else (None, None)
    cells = grid()
    if a.only:
        cells = [c for c in cells if cell_name(c) in a.only]
    res: dict = {"pass": a.pass_name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                 "machine": f"{platform.node()} {os.cpu_count()} cores", "model": MODEL,
                 "server": f"max-model-len {MAX_MODEL_LEN}, max-num-seqs {BATCH_LIMIT}, prefix caching off, "
                           "bfloat16, enforce-eager (benchmarks/bench_vs_vllm.py start_vllm)",
                 "pin": {"server_cpus": server_cpus, "client_cpus": client_cpus}, "pairs": a.pairs, "runs": []}
    url = f"http://127.0.0.1:{a.port}"
    out_path = HERE / f"pass-{a.pass_name}.json"
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        server = start_vllm(a.port, tmp / "vllm.log", no_cache=True, cpus=server_cpus)
        try:
            run_theirs(url, cells[0], tmp / "discard.json", client_cpus)   # the first run after start is slow
            for ci, c in enumerate(cells):
                for i in range(a.pairs):
                    pair = (("autotune", run_ours), ("vllm", run_theirs))
                    for name, fn in (pair if (i + ci) % 2 == 0 else pair[::-1]):
                        reset_prefix_cache(url)
                        la = os.getloadavg()[0]
                        srv0, cli0 = tree_cpu_s(server.pid), _children_cpu_s()
                        x, d, wall = counted(url, lambda: fn(url, c, tmp / f"{name}-{ci}-{i}.json", client_cpus))
                        row = {"cell": cell_name(c), **c, "client": name, "pair": i,
                               "load_avg_1m_before": la, "wall_s": wall,
                               "client_cpu_s": _children_cpu_s() - cli0, "server_cpu_s": tree_cpu_s(server.pid) - srv0,
                               **{k: x[k] for k in KEYS}, "completed": x["completed"], "failed": x["failed"],
                               "total_input_tokens": x.get("total_input_tokens"),
                               "total_output_tokens": x.get("total_output_tokens"), "duration": x.get("duration"),
                               **server_means(d)}
                        res["runs"].append(row)
                        print(json.dumps(row), flush=True)
                out_path.write_text(json.dumps(res, indent=1) + "\n")   # a cut pass keeps its cells
        finally:
            stop_vllm(server)
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out_path.write_text(json.dumps(res, indent=1) + "\n")
    return out_path


def ratios(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per metric: autotune / vLLM on the medians of each client's runs, and the mean of the per-pair
    ratios (pairs are back to back, so they see the least drift)."""
    out = {}
    for k in KEYS:
        a = [r[k] for r in runs if r["client"] == "autotune"]
        v = [r[k] for r in runs if r["client"] == "vllm"]
        per = [ra[k] / rv[k] for ra in runs for rv in runs
               if ra["client"] == "autotune" and rv["client"] == "vllm" and ra["pair"] == rv["pair"] and rv[k]]
        out[k] = {"of_medians": median(a) / median(v) if a and v and median(v) else math.nan,
                  "pair_mean": mean(per) if per else math.nan,
                  "ours": median(a) if a else math.nan, "vllm": median(v) if v else math.nan}
    return out


def _range(values: list[float]) -> float:
    return (max(values) - min(values)) / median(values) if values and median(values) else math.nan


def table() -> str:
    passes = sorted(HERE.glob("pass-*.json"))
    docs = [json.loads(p.read_text()) for p in passes]
    cells = [cell_name(c) for c in grid()]
    head = "| cell | " + " | ".join(f"{k} ({d['pass']})" for k in KEYS for d in docs) + " |"
    lines = [head, "|" + "---|" * (1 + len(KEYS) * len(docs))]
    off: dict[str, list[str]] = {}
    for name in cells:
        row = [name]
        for k in KEYS:
            for d in docs:
                runs = [r for r in d["runs"] if r["cell"] == name]
                if not runs:
                    row.append("-")
                    continue
                r = ratios(runs)[k]["of_medians"]
                bad = abs(r - 1) > 0.05
                if bad:
                    off.setdefault(f"{name} {k}", []).append(d["pass"])
                noise = max(_range([x[k] for x in runs if x["client"] == who]) for who in ("autotune", "vllm"))
                mark = " †" if bad and abs(r - 1) > noise else ""
                row.append((f"**{r:.3f}**" if bad else f"{r:.3f}") + mark)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Run-to-run range of each client, (max - min) / median over its runs, the larger of the two "
              "clients: a ratio off by less than this is inside the noise of a single client.", "", head,
              lines[1]]
    for name in cells:
        row = [name]
        for k in KEYS:
            for d in docs:
                spans = [_range([r[k] for r in d["runs"] if r["cell"] == name and r["client"] == who])
                         for who in ("autotune", "vllm")]
                row.append(f"{max(spans):.2f}" if all(math.isfinite(x) for x in spans) else "-")
        lines.append("| " + " | ".join(row) + " |")
    both = [key for key, ps in off.items() if len(ps) == len(docs) and len(docs) > 1]
    lines.append("")
    lines.append(f"Ratios autotune / vLLM of the medians over each client's runs; bold: off by more than 5 %; "
                 f"†: off by more than the run-to-run range of either client (below). "
                 f"Off in every pass: {', '.join(both) if both else 'none'}.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass-name", help="label of this pass: writes pass-NAME.json")
    ap.add_argument("--pairs", type=int, default=3, help="ABBA pairs per cell (>= 3 runs of each client)")
    ap.add_argument("--pin", default="0:1", metavar="SERVER:CLIENT")
    ap.add_argument("--port", type=int, default=18811)
    ap.add_argument("--only", nargs="*", help="cells by name (e.g. '32/16 c=1'): re-measure those only")
    ap.add_argument("--table", action="store_true", help="print the table from every pass-*.json")
    a = ap.parse_args()
    if a.table:
        print(table())
        return
    if not a.pass_name:
        ap.error("--pass-name is required for a pass")
    print(run_pass(a))


if __name__ == "__main__":
    main()
