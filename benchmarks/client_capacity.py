#!/usr/bin/env python3
"""Client capacity: streamed tokens/s autotune's load generator sustains, and how far its timestamps are
from the server's own send times, beside `vllm bench serve`'s client on the same server.

The server is autotune.bench.mockserver in `stream` mode, in its own process: every request streams
one token every ITL ms and the server logs each chunk's send time on the shared monotonic clock
(CLOCK_MONOTONIC is system-wide on Linux, so client and server times compare directly). Offered load =
streams x 1000/ITL tokens/s.

Errors, per level:
- matched (autotune only; requests are told apart by a unique output length): per chunk, arrival minus
  send. "TTFT error" = that delay for the first chunk; "ITL error" = |client gap - server gap|.
- distribution (both clients): |client p50 - server p50| of TTFT and of ITL.

    .venv/bin/python benchmarks/client_capacity.py [--quick] [--out benchmarks/client_capacity_results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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

PEER = Path("/work/shared/peers/vllm_bench_cpu.py")
TOKENIZER = REPO / "models" / "demo"          # vLLM's random dataset needs some local tokenizer


def get(url: str, method: str = "GET") -> object:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def start_server(port: int, itl_ms: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "autotune.bench.mockserver", "--port", str(port), "--mode", "stream",
                          "--itl-ms", str(itl_ms), "--log-sends"], cwd=REPO, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            get(f"http://127.0.0.1:{port}/health")
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("mock server did not start")


def server_truth(log: list[dict]) -> tuple[list[float], list[float]]:
    ttft = [(e["sends"][0] - e["recv"]) * 1000 for e in log if e["sends"]]
    itl = [g * 1000 for e in log for g in np.diff(e["sends"])]
    return ttft, itl


def run_ours(url: str, streams: int, n_req: int, out_len: int, tmp: Path) -> dict:
    f = tmp / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"r{i}", "output_len": out_len + i}) + "\n" for i in range(n_req)))
    get(url + "/mock/sends", "DELETE")
    m = asyncio.run(run_load(url, "mock", parse_workload({"kind": "jsonl", "path": str(f)}),
                             concurrency=streams, num_requests=n_req))
    log = {e["n_out"]: e for e in get(url + "/mock/sends", "DELETE")}   # type: ignore[union-attr]
    ttft_err, itl_err = [], []
    for r in m.records:
        e = log.get(r.output_tokens)
        if not r.ok or e is None or len(e["sends"]) != len(r.itl_ms) + 1:
            continue
        arrivals = r.start_s + (r.ttft_ms + np.concatenate([[0.0], np.cumsum(r.itl_ms)])) / 1000.0
        delay = (arrivals - np.asarray(e["sends"])) * 1000.0
        ttft_err.append(delay[0])
        itl_err.extend(np.abs(np.diff(delay)))
    s_ttft, s_itl = server_truth(list(log.values()))
    x = m.metrics
    return {"client": "autotune", "tokens_per_s": x["output_throughput"], "completed": x["completed"],
            "failed": x["failed"], "matched_requests": len(ttft_err),
            "ttft_err_p50_ms": float(np.median(ttft_err)), "ttft_err_p99_ms": float(np.percentile(ttft_err, 99)),
            "itl_err_p50_ms": float(np.median(itl_err)), "itl_err_p99_ms": float(np.percentile(itl_err, 99)),
            "dist_ttft_err_ms": abs(x["median_ttft_ms"] - float(np.median(s_ttft))),
            "dist_itl_err_ms": abs(x["median_itl_ms"] - float(np.median(s_itl))),
            "client_cpu_pct": m.client.cpu_pct, "loop_lag_p99_ms": m.client.loop_lag_p99_ms,
            "saturated": m.client.saturated, "health": m.client.note}


def run_vllm(url: str, streams: int, n_req: int, out_len: int, tmp: Path) -> dict:
    get(url + "/mock/sends", "DELETE")
    cmd = ["/work/main/.venv/bin/python", str(PEER), "--backend", "vllm", "--base-url", url, "--model", "mock",
           "--tokenizer", str(TOKENIZER), "--dataset-name", "random", "--random-input-len", "4",
           "--random-output-len", str(out_len), "--num-prompts", str(n_req), "--max-concurrency", str(streams),
           "--ignore-eos", "--save-result", "--save-detailed", "--result-dir", str(tmp), "--result-filename",
           "vllm.json", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, start_new_session=True)
    if p.returncode != 0:
        return {"client": "vllm bench serve", "error": p.stderr.strip().splitlines()[-1:]}
    x = json.loads((tmp / "vllm.json").read_text())
    s_ttft, s_itl = server_truth(get(url + "/mock/sends", "DELETE"))   # type: ignore[arg-type]
    return {"client": "vllm bench serve", "tokens_per_s": x["output_throughput"], "completed": x["completed"],
            "failed": x["failed"], "dist_ttft_err_ms": abs(x["median_ttft_ms"] - float(np.median(s_ttft))),
            "dist_itl_err_ms": abs(x["median_itl_ms"] - float(np.median(s_itl)))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "client_capacity_results.json"))
    ap.add_argument("--quick", action="store_true", help="one small level (smoke test)")
    ap.add_argument("--no-vllm", action="store_true")
    a = ap.parse_args()
    levels = [(16, 2.0), (48, 2.0), (96, 2.0), (128, 0.0)] if not a.quick else [(16, 2.0)]
    out_len = 200
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": f"{platform.node()} {os.cpu_count()} cores",
               "load_avg_before": os.getloadavg(), "levels": []}
    port = 18700
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for streams, itl in levels:
            server = start_server(port, itl)
            url = f"http://127.0.0.1:{port}"
            try:
                n_req = streams * 3
                offered = streams * 1000.0 / itl if itl else None
                row = {"streams": streams, "server_itl_ms": itl, "offered_tokens_per_s": offered, "runs": []}
                row["runs"].append(run_ours(url, streams, n_req, out_len, tmp))
                if not a.no_vllm:
                    row["runs"].append(run_vllm(url, streams, n_req, out_len, tmp))
                results["levels"].append(row)
                print(json.dumps(row), flush=True)
            finally:
                server.terminate()
                server.wait(timeout=10)
            port += 1
    results["load_avg_after"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
