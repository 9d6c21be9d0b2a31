"""A minimal OpenAI-compatible streaming server whose behaviour is known exactly, for tests and benchmarks.

Two service models, chosen per server:
- `stream`: every request streams its tokens on its own, one every `itl_ms` (0: as fast as it can);
  the server logs when it sent each chunk, so a client's timestamps can be checked against the truth
  (`GET /mock/sends`, same monotonic clock on one machine).
- `batch`: a continuous-batching scheduler like an LLM engine's. Each step emits one token to every
  running request and takes `step_ms + per_seq_ms * batch`; at most `max_seqs` run, the rest queue
  (FIFO). TPOT at a steady batch b is therefore `step_ms + per_seq_ms * b`, which makes the highest
  concurrency meeting a TPOT limit a number known in advance.

`order=random` (batch mode) gives a free slot to a waiting request drawn from a seeded generator
instead of the longest waiting: the same tokens/s, a longer tail of the TTFT (tests/fixtures/standin_vllm.py
uses it for a load at which the SLO holds that moves between servers while the tokens/s do not).
Chat requests may carry images (`image_url` content parts): each adds `image_tokens` prompt tokens and,
in stream mode, `image_ms` before the first chunk, so figures per request class are known in advance.
`fail_every=N` answers every Nth request with HTTP 500 (failed-request accounting);
`reset_cache=false` makes `POST /reset_prefix_cache` a 404, as on a vLLM without dev mode.
`jit_batch=B` (batch mode) mimics a kernel JIT-compiled under load: once a batch of B or more has run
`jit_after` steps since the server was last idle, the next step stalls `jit_ms` longer and then appends vLLM's JIT-monitor warning to `log_path`; the compile is cached
after `jit_times` of them (1: as Triton's cache does; 2: the next load that reaches B compiles again).

    python -m autotune.bench.mockserver --port 8123 --mode batch --step-ms 5 --per-seq-ms 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from aiohttp import web


@dataclass
class MockConfig:
    mode: str = "stream"          # stream | batch
    itl_ms: float = 0.0           # stream mode: gap between chunks of one request
    ttft_ms: float = 0.0          # stream mode: wait before the first chunk
    step_ms: float = 5.0          # batch mode: fixed cost of a step
    per_seq_ms: float = 0.5       # batch mode: added cost per running sequence
    max_seqs: int = 256           # batch mode: most sequences in one step
    order: str = "fifo"           # batch mode: which waiting request a free slot takes: fifo | random
    order_seed: int = 0           # batch mode, order random: the generator's seed
    fail_every: int = 0           # every Nth request fails with HTTP 500 (0: never)
    reset_cache: bool = True      # False: /reset_prefix_cache answers 404
    log_sends: bool = False       # stream mode: keep every chunk's send time
    jit_batch: int = 0            # batch mode: a batch this large triggers a "kernel compile" (0: never)
    jit_after: int = 0            # steps at that batch (since idle) before it: past a closed loop's first wave
    jit_ms: float = 0.0           # how long that compile stalls the step
    jit_times: int = 1            # compiles before the kernel counts as cached
    jit_kernel: str = "fused_moe_kernel"
    log_path: str | None = None   # where the compile's warning line is appended (the server log)
    image_tokens: int = 0         # prompt tokens each image of a chat request adds
    image_ms: float = 0.0         # stream mode: extra wait before the first chunk, per image


@dataclass
class Seq:
    remaining: int
    gone: bool = False            # the client hung up: leave the batch at the next step
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)


class Batcher:
    """The `batch` model's scheduler loop."""

    def __init__(self, cfg: MockConfig) -> None:
        import random

        self.cfg = cfg
        self.rng = random.Random(cfg.order_seed)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.wake = asyncio.Event()
        self.steps = 0
        self.compiles = 0
        self.jit_armed = True         # re-armed when the server goes idle: one compile per load at most
        self.hot = 0                  # steps at a batch >= jit_batch since the server was last idle

    def submit(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self.wake.set()

    def idle(self) -> bool:
        """No sequence holds a slot or waits for one (also none whose client hung up)."""
        return not (self.running or self.waiting)

    async def run(self) -> None:
        next_t = time.perf_counter()
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                next_t = time.perf_counter()
                self.jit_armed, self.hot = True, 0
            while self.waiting and len(self.running) < self.cfg.max_seqs:
                i = self.rng.randrange(len(self.waiting)) if self.cfg.order == "random" else 0
                self.running.append(self.waiting[i])
                del self.waiting[i]
            compiling = self._compiles()
            next_t += (self.cfg.step_ms + self.cfg.per_seq_ms * len(self.running)
                       + (self.cfg.jit_ms if compiling else 0.0)) / 1000.0
            delay = next_t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_t = time.perf_counter()   # fell behind: do not try to catch up with a burst
            if compiling:
                self._log_compile()            # vLLM warns after the compile, not before
            self.steps += 1
            still = []
            for s in self.running:
                if s.gone:
                    continue
                s.remaining -= 1
                s.tokens.put_nowait(s.remaining)
                if s.remaining > 0:
                    still.append(s)
            self.running = still

    def _compiles(self) -> bool:
        cfg = self.cfg
        if not cfg.jit_batch or not self.jit_armed or self.compiles >= cfg.jit_times:
            return False
        if len(self.running) < cfg.jit_batch:
            return False
        self.hot += 1
        if self.hot <= cfg.jit_after:
            return False
        self.compiles += 1
        self.jit_armed = False
        return True

    def _log_compile(self) -> None:
        if not self.cfg.log_path:
            return
        stamp = time.strftime("%m-%d %H:%M:%S")
        with open(self.cfg.log_path, "a", encoding="utf-8") as f:
            f.write(f"(Worker_TP0 pid={os.getpid()}) WARNING {stamp} [jit_monitor.py:106] Triton kernel JIT "
                    f"compilation during inference: {self.cfg.jit_kernel}. This causes a latency spike; "
                    "consider extending warmup to cover this shape/config. (autotune mock server)\n")


def _chunk(text: str, chat: bool, model: str) -> bytes:
    choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if chat
                              else {"index": 0, "text": text, "finish_reason": None})
    return b"data: " + json.dumps({"id": "mock", "object": "chunk", "model": model, "choices": [choice]}).encode() + b"\n\n"


def build_app(cfg: MockConfig) -> web.Application:
    app = web.Application()
    state: dict[str, Any] = {"n": 0, "sends": [], "batcher": None, "resets": []}

    async def on_start(app: web.Application) -> None:
        if cfg.mode == "batch":
            state["batcher"] = Batcher(cfg)
            state["task"] = asyncio.create_task(state["batcher"].run())

    async def on_stop(app: web.Application) -> None:
        if state.get("task"):
            state["task"].cancel()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def reset(request: web.Request) -> web.Response:
        # Like vLLM: the reset fails while sequences (also ones whose client hung up) still hold blocks.
        if not cfg.reset_cache:
            return web.Response(status=404, text="Not Found")
        b = state.get("batcher")
        ok = b is None or b.idle()
        state["resets"].append(ok)
        return web.json_response({"success": ok})

    async def resets(request: web.Request) -> web.Response:
        return web.json_response(state["resets"])

    async def sends(request: web.Request) -> web.Response:
        out = web.json_response(state["sends"])
        if request.method == "DELETE":
            state["sends"] = []
        return out

    async def complete(request: web.Request) -> web.StreamResponse:
        t_recv = time.perf_counter()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        state["n"] += 1
        if cfg.fail_every and state["n"] % cfg.fail_every == 0:
            return web.json_response({"error": {"message": "mock failure"}}, status=500)
        n_out = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        prompt = body.get("prompt") if not chat else body["messages"][-1]["content"]
        parts = [p for m in body.get("messages") or [] if isinstance(m.get("content"), list) for p in m["content"]]
        images = sum(1 for p in parts if p.get("type") == "image_url")
        if parts:
            prompt = " ".join(p.get("text", "") for p in parts if p.get("type") == "text")
        n_in = len(str(prompt).split()) + images * cfg.image_tokens
        model = str(body.get("model", "mock"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            return await _stream(resp, chat, model, n_in, n_out, t_recv, images * cfg.image_ms)
        except (ConnectionError, asyncio.CancelledError):
            return resp      # the client went away (an aborted load step): nothing to send

    async def _stream(resp: web.StreamResponse, chat: bool, model: str, n_in: int, n_out: int,
                      t_recv: float, extra_ttft_ms: float = 0.0) -> web.StreamResponse:
        times: list[float] = []
        piece = _chunk(" tok", chat, model)
        if cfg.mode == "batch":
            seq = Seq(n_out)
            state["batcher"].submit(seq)
            try:
                while True:
                    left = await seq.tokens.get()
                    await resp.write(piece)
                    if left == 0:
                        break
            finally:
                seq.gone = True
        else:
            if cfg.ttft_ms or extra_ttft_ms:
                await asyncio.sleep((cfg.ttft_ms + extra_ttft_ms) / 1000.0)
            due = time.perf_counter()
            for i in range(n_out):
                if i and cfg.itl_ms:
                    due += cfg.itl_ms / 1000.0
                    delay = due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                elif i:
                    await asyncio.sleep(0)
                if cfg.log_sends:
                    times.append(time.perf_counter())
                await resp.write(piece)
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        await resp.write(b"data: " + json.dumps({"id": "mock", "choices": [], "usage": usage}).encode()
                         + b"\n\ndata: [DONE]\n\n")
        if cfg.log_sends:
            state["sends"].append({"recv": t_recv, "n_out": n_out, "sends": times})
        await resp.write_eof()
        return resp

    app.on_startup.append(on_start)
    app.on_cleanup.append(on_stop)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/reset_prefix_cache", reset)
    app.router.add_get("/mock/sends", sends)
    app.router.add_get("/mock/resets", resets)
    app.router.add_delete("/mock/sends", sends)   # read and clear
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run `app` on a free loopback port inside the current event loop; yields its base URL. Tests and
    benchmarks use it to put a server of known behaviour beside the client in one process."""
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m autotune.bench.mockserver")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8123)
    for f in ("mode", "itl_ms", "ttft_ms", "step_ms", "per_seq_ms", "max_seqs", "fail_every"):
        default = getattr(MockConfig, f)
        p.add_argument("--" + f.replace("_", "-"), type=type(default), default=default)
    p.add_argument("--no-reset-cache", action="store_true")
    p.add_argument("--log-sends", action="store_true")
    a = p.parse_args(argv)
    cfg = MockConfig(**{f: getattr(a, f) for f in ("mode", "itl_ms", "ttft_ms", "step_ms", "per_seq_ms",
                                                   "max_seqs", "fail_every")},
                     reset_cache=not a.no_reset_cache, log_sends=a.log_sends)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        p.error("the mock server listens on loopback only")
    web.run_app(build_app(cfg), host=a.host, port=a.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
