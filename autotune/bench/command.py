"""`autotune bench`: load against any running OpenAI-compatible server, from the command line.

    autotune bench --url http://127.0.0.1:8000 --model M --workload random:input_len=300,output_len=40 \
        --concurrency 8 --num-requests 200 --slo ttft=1s --json out.json
    autotune bench --url ... --model M --slo tpot:p50<=50ms --capacity concurrency   # capacity search
"""

from __future__ import annotations

import asyncio
import math
from urllib.parse import urlparse

from autotune.bench import measurement_flags as mflags
from autotune.bench.capacity import find_capacity, reset_prefix_cache
from autotune.bench.profile import describe, format_profile
from autotune.bench.report import format_capacity, format_measurement, write_json
from autotune.bench.runner import run_load
from autotune.bench.tokens import load_tokenizer
from autotune.bench.workloads import parse_workload
from autotune.cli import OneLineParser
from autotune.errors import UserError, one_line_errors
from autotune.slo import SLO, check_slo_classes


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{text!r} is not a number") from None
    if not v > 0 or math.isnan(v):
        raise UserError(f"{text!r} must be > 0")
    return v


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="autotune bench", description="Benchmark a running OpenAI-compatible server "
                      "(vllm bench serve's metrics, plus goodput and capacity under an SLO).")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--endpoint", choices=["completions", "chat"],
                   help="default: chat for a workload with images, else completions")
    p.add_argument("--workload", default="random:input_len=128,output_len=64",
                   help="random:input_len=N,output_len=N[,range_ratio=R] | jsonl:path=FILE | "
                        "prefix:prefix_len=K,suffix_len=S,output_len=O | "
                        "image:input_len=N,output_len=N[,share=S][,images=K|LOW-HIGH][,sizes=WxH/WxH][,format=png|jpeg] | "
                        "trace:path=FILE[,time_scale=X][,start=S][,duration=D] (replayed at its recorded times "
                        "when no --concurrency/--rate is given)")
    p.add_argument("--concurrency", type=int, help="requests in flight (closed loop; with --rate: a cap)")
    p.add_argument("--rate", help="requests per second, open loop (Poisson; 'inf' sends all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals: 1 Poisson, <1 bursty")
    p.add_argument("--num-requests", type=int, help="measured requests (default 200)")
    p.add_argument("--duration", type=float, help="measure for this many seconds instead of a count")
    p.add_argument("--warmup", type=int, help="unmeasured requests sent first (default 0; capacity: 16 per step)")
    p.add_argument("--slo", help="e.g. ttft=1s or ttft:p95<=800ms,tpot:p99<=50ms (goodput, capacity)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="tokenizer directory or tokenizer.json (default: the model's, if local)")
    p.add_argument("--timeout", type=float, default=600, help="per-request timeout in seconds")
    p.add_argument("--json", metavar="FILE", help="write the result (and per-request records) as JSON")
    p.add_argument("--check-slo", action="store_true", help="exit 1 when the run misses --slo or a request "
                                                           "fails (a smoke test's pass/fail)")
    p.add_argument("--capacity", choices=["concurrency", "rate", "time_scale"],
                   help="search the highest load meeting --slo (time_scale: a trace's speed-up)")
    p.add_argument("--max-steps", type=int, default=6, help="capacity search: most load steps")
    p.add_argument("--requests-per-step", type=int, default=200, help="capacity search: requests per step")
    p.add_argument("--upper", type=float, help="capacity search: highest load to try")
    p.add_argument("--start", type=float, help="capacity search: first load (default: a single-stream probe)")
    return p


def main(argv: list[str]) -> int:
    return one_line_errors("autotune bench", _run, build_parser().parse_args(argv))


def _run(args) -> int:  # type: ignore[no-untyped-def]
    url = urlparse(args.url)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise UserError(f"--url {args.url!r} is not a base URL like http://127.0.0.1:8000")
    workload = parse_workload(args.workload)
    args.endpoint = args.endpoint or ("chat" if workload.max_images else "completions")
    slo = SLO.parse(args.slo) if args.slo else None
    if slo is not None:
        check_slo_classes(slo, workload)
    if args.check_slo and (slo is None or args.capacity):
        raise UserError("--check-slo needs --slo and a fixed load (not --capacity)")
    rate = None if args.rate is None else _positive_float(args.rate)
    if args.num_requests is not None and args.duration is not None:
        raise UserError("give --num-requests or --duration, not both")
    tok = load_tokenizer(args.tokenizer, args.model)
    profile = describe(workload.one_pass(tok), tok)
    print(format_profile(profile), flush=True)
    if args.capacity:
        if slo is None:
            raise UserError("--capacity needs --slo: capacity is the highest load meeting it")
        result = asyncio.run(find_capacity(
            args.url, args.model, workload, slo, search=args.capacity, max_steps=args.max_steps,
            requests_per_step=args.requests_per_step, warmup=16 if args.warmup is None else args.warmup, seed=args.seed,
            tokenizer=args.tokenizer, start=args.start, upper=args.upper, endpoint=args.endpoint,
            timeout_s=args.timeout, on_step=lambda s: print(
                f"step: load {s.load:g} -> {'met' if s.slo_met else 'broke'} the SLO", flush=True)))
        print(format_capacity(result))
        if args.json:
            write_json(args.json, {**result.to_json(with_records=True), "workload_profile": profile})
        return 0
    if args.concurrency is None and rate is None and workload.kind != "trace":
        raise UserError("give a load: --concurrency N (closed loop) or --rate R (open loop)")
    # Two runs with the same seed replay the same prompts: without a reset the second one's TTFT is a
    # cache hit, not a prefill. vLLM resets only in dev mode (VLLM_SERVER_DEV_MODE=1); elsewhere the
    # hit share below still names a flattered run.
    reset = asyncio.run(reset_prefix_cache(args.url, wait_s=10))
    m = asyncio.run(run_load(args.url, args.model, workload, concurrency=args.concurrency, rate=rate,
                             burstiness=args.burstiness, num_requests=args.num_requests, duration_s=args.duration,
                             warmup=args.warmup or 0, slo=slo, seed=args.seed, endpoint=args.endpoint,
                             tokenizer=args.tokenizer, timeout_s=args.timeout))
    m.load["cache_reset"] = reset
    if mflags.prefix_flattered(m.metrics.get("prefix_cache_hit_pct"), workload.kind):
        m.flags = mflags.merge(m.flags, [mflags.PREFIX_HITS])
    if m.client.saturated:
        m.flags = mflags.merge(m.flags, [mflags.CLIENT_SATURATED])
    print(format_measurement(m))
    if args.json:
        out = m.to_json(with_records=True)
        out.update({"model_id": args.model, "backend": "openai", "endpoint_type": args.endpoint,
                    "request_rate": rate if rate is not None else m.load.get("request_rate") or math.inf, "burstiness": args.burstiness,
                    "max_concurrency": args.concurrency, "num_prompts": args.num_requests,
                    "slo": str(slo) if slo else None, "workload_profile": profile})
        write_json(args.json, out)
    if args.check_slo:
        assert slo is not None
        return _slo_verdict(slo, m.metrics)
    return 0


def _slo_verdict(slo: SLO, metrics: dict[str, float]) -> int:
    failed = int(metrics.get("failed") or 0)
    margins = {k: v for k, v in slo.margins(metrics).items() if v > 0}
    if failed or margins:
        print("SLO check: FAILED (" + ", ".join([*(f"{k} over by {v:.4g} ms" for k, v in margins.items()),
                                                 *([f"{failed} request(s) failed"] if failed else [])]) + ")")
        return 1
    print(f"SLO check: passed ({slo})")
    return 0
