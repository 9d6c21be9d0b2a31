"""The twin's HTTP server: vLLM's OpenAI endpoints over the simulated scheduler.

One asyncio task steps the scheduler in simulated time and sleeps until each step's end maps to
wall time (`sim = (wall - t0) x time_scale`). When the Python side cannot keep one SSE event per
token (high time scales, many streams), a request's tokens are held and sent together, at most one
chunk per `flush interval` of wall time; the first and the last token are never held. Every chunk
carries its tokens' simulated times, and the coalescing shows in the log and in /metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from autotune.perfmodel.predict import Plan
from autotune.sim.openai import (BadRequest, ChunkWriter, ImageRules, ParsedRequest, error_body, parse_request,
                                 token_text)
from autotune.sim.scheduler import Scheduler, SimRequest, SimulatedOOM, prompt_block_hashes
from autotune.sim.telemetry import GpuMeter, prometheus

log = logging.getLogger("autotune.sim")
TURNAROUND_S = 0.05  # wall seconds after a step during which a new request still meets the engine's clock
MAX_LAG_S = 0.02   # wall seconds the stepping loop may fall behind before the simulated clock slows


@dataclass
class _Live:
    """A request's delivery state: tokens waiting to be sent and the queue the handler reads."""

    sim: SimRequest
    parsed: ParsedRequest
    queue: asyncio.Queue[tuple[int, list[float], bool] | None] = field(default_factory=asyncio.Queue)
    pending: list[float] = field(default_factory=list)
    sent: int = 0
    last_flush: float = 0.0
    offset: float = 0.0        # simulated seconds before this instance saw it (PD: prefill elsewhere + transfer)
    handoff: bool = False      # PD prefill side: answer with the kv_transfer_params a decode instance needs


def encoder_work(rules: ImageRules, sizes: list[tuple[int, int]]) -> dict[str, Any]:
    """A request's images as the scheduler's encoder fields (tokens for its budget, FLOPs for its steps)."""
    v = rules.vision
    if v is None or not sizes:
        return {}
    return {"encoder_tokens": sum(v.placeholders(w, h, rules.kwargs) for w, h in sizes),
            "encoder_flops": sum(v.flops(v.patches(w, h, rules.kwargs)) for w, h in sizes)}


class SimServer:
    def __init__(self, plan: Plan, served_name: str, time_scale: float = 1.0, seed: int = 0,
                 noise: float = 0.0, max_events_per_s: float = 3000.0,
                 kv_transfer: dict[str, Any] | None = None, engine_id: str = "sim"):
        self.plan = plan
        self.kv_transfer = kv_transfer      # --kv-transfer-config: plays NixlConnector's kv_transfer_params
        self.engine_id = engine_id
        self.name = served_name
        self.scale = time_scale
        self.seed = seed
        self.sched = Scheduler(plan, seed=seed, noise=noise)
        cfg = plan.config
        self.image_rules = ImageRules(plan.profile.vision if cfg.images_enabled else None, cfg.mm_processor_kwargs,
                                      cfg.mm_image_limit)
        self.meter = GpuMeter(plan)
        self.max_events = max_events_per_s
        self.t0 = time.monotonic()
        self.clock = 0.0                       # simulated seconds since ready
        self.arrivals: list[tuple[float, _Live]] = []
        self.live: dict[str, _Live] = {}
        self.wake = asyncio.Event()
        self.ids = itertools.count(1)
        self.stream = {"chunks_total": 0.0, "tokens_streamed_total": 0.0, "coalesced_chunks_total": 0.0,
                       "lag_seconds": 0.0, "wall_slip_seconds_total": 0.0,
                       "time_scale": time_scale}
        self.coalescing_logged = False
        self.slip_logged = False
        self.last_step_wall = 0.0
        self.died: str | None = None
        self.task: asyncio.Task[None] | None = None

    # ---- time --------------------------------------------------------------------------------
    def sim_of_wall(self, wall: float | None = None) -> float:
        return ((time.monotonic() if wall is None else wall) - self.t0) * self.scale

    def wall_of_sim(self, sim: float) -> float:
        return self.t0 + sim / self.scale

    # ---- the stepping loop ---------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.monotonic()
        self.meter.ready = True
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        steps_since_yield = 0
        while True:
            self._admit()
            if self.sched.idle():
                self.wake.clear()
                await self.wake.wait()
                continue   # the arrival's stamp (not the wall clock) moves the clock on
            try:
                step = self.sched.schedule()
            except SimulatedOOM as e:
                self._die(str(e))
                return
            if step is None:   # nothing fits right now; let time pass
                self.clock = max(self.clock + 1e-3, self.sim_of_wall())
                await asyncio.sleep(0.001)
                continue
            t_end = self.clock + step.cost.seconds
            delay = self.wall_of_sim(t_end) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                steps_since_yield = 0
            else:
                self.stream["lag_seconds"] = -delay
                if -delay > MAX_LAG_S:
                    self._slip(-delay)
                steps_since_yield += 1
                if steps_since_yield >= 8:
                    await asyncio.sleep(0)
                    steps_since_yield = 0
            self.clock = t_end
            self.last_step_wall = time.monotonic()
            self.meter.record(step, t_end)
            self.sched.advance(step, t_end)
            self._flush(step)

    def _slip(self, lag: float) -> None:
        """Python could not keep up: slow the simulated clock rather than let requests queue in wall
        time the simulation never sees (arrivals are stamped with the clock they actually meet)."""
        self.t0 += lag
        self.stream["wall_slip_seconds_total"] += lag
        if not self.slip_logged:
            self.slip_logged = True
            log.warning("the simulator cannot keep time scale %g (%.0f ms behind): slowing the simulated clock; "
                        "simulated times stay exact, wall time per simulated second grows (see "
                        "autotune_sim_wall_slip_seconds_total)", self.scale, lag * 1e3)

    def _admit(self) -> None:
        """Hand the scheduler every request that has arrived by the simulated clock; an idle engine
        first jumps to the earliest arrival."""
        if not self.arrivals:
            return
        if self.sched.idle():
            self.clock = max(self.clock, min(t for t, _ in self.arrivals))
        keep = []
        for t, lv in self.arrivals:
            if t <= self.clock:
                self.sched.add(lv.sim)
            else:
                keep.append((t, lv))
        self.arrivals = keep

    def _flush(self, step: Any) -> None:
        now = time.monotonic()
        interval = len(self.sched.running) / self.max_events if self.max_events > 0 else 0.0
        for req, _ in step.items:
            lv = self.live.get(req.rid)
            if lv is None or not lv.pending:
                continue
            first, last = lv.sent == 0, req.finished
            if first or last or now - lv.last_flush >= interval:
                tokens = lv.pending
                lv.pending = []
                lv.sent += len(tokens)
                lv.last_flush = now
                self.stream["chunks_total"] += 1
                self.stream["tokens_streamed_total"] += len(tokens)
                if len(tokens) > 1:
                    self.stream["coalesced_chunks_total"] += 1
                    if not self.coalescing_logged:
                        self.coalescing_logged = True
                        log.warning("clients cannot take one SSE event per token at time-scale %g with %d "
                                    "running streams: coalescing tokens into chunks (each chunk carries its "
                                    "tokens' simulated times in autotune_sim.token_times_s; see "
                                    "autotune_sim_coalesced_chunks_total)", self.scale, len(self.sched.running))
                lv.queue.put_nowait((lv.sent, [t - req.arrival + lv.offset for t in tokens], last))

    def _die(self, message: str) -> None:
        self.died = message
        for line in ("Traceback (most recent call last):", '  File "autotune/sim/scheduler.py", in schedule',
                     message, "EngineCore encountered a fatal error."):
            log.error("%s", line)
        for lv in self.live.values():
            lv.queue.put_nowait(None)

    # ---- HTTP ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/sim/telemetry", self.telemetry)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.died else 200)

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0+sim", "simulated": True})

    async def models(self, _: web.Request) -> web.Response:
        card = {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "autotune-sim",
                "root": self.name, "parent": None, "max_model_len": self.plan.config.max_model_len,
                "simulated": True, "gpu": self.plan.gpu.name, "num_gpus": self.plan.num_gpus}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, _: web.Request) -> web.Response:
        text = prometheus(self.sched, self.name, self.stream, self.clock)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def telemetry(self, _: web.Request) -> web.Response:
        return web.json_response(self.meter.snapshot(max(self.clock, self.sim_of_wall())))

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        self.sched.reset_prefix_cache()
        return web.Response(status=200)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _arrival(self) -> float:
        """While the engine is busy (or just was), a request is stamped with the engine's clock: a
        client's turnaround of a few wall milliseconds would otherwise become time_scale x that of
        idle simulated time. An idle engine lets simulated time pass with the wall clock."""
        if not self.sched.idle() or time.monotonic() - self.last_step_wall < TURNAROUND_S:
            return self.clock
        return max(self.clock, self.sim_of_wall())

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = self._arrival()
        try:
            body = await request.json()
            parsed = parse_request(body, chat, self.plan.config.max_model_len, self.image_rules)
        except (BadRequest, json.JSONDecodeError, UnicodeDecodeError) as e:
            return web.json_response(error_body(str(e)), status=400)
        if parsed.model and parsed.model != self.name:
            return web.json_response(error_body(f"The model `{parsed.model}` does not exist.", 404), status=404)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim{next(self.ids)}"
        handoff, remote, offset = self._kv_params(body.get("kv_transfer_params"), len(parsed.prompt_tokens))
        sim = SimRequest(rid, len(parsed.prompt_tokens), parsed.max_tokens, arrival + offset,
                         prompt_block_hashes(parsed.prompt_tokens, self.plan.config.block_size),
                         **encoder_work(self.image_rules, parsed.images), remote_cached=remote)
        lv = _Live(sim, parsed, handoff=handoff)
        if remote:   # the client's clock started at the prefill instance: its prefill counts too
            prefill_s = float((body["kv_transfer_params"].get("autotune_sim") or {}).get("prefill_s", 0.0))
            lv.offset = offset + prefill_s
            arrival -= prefill_s
        sim.on_token = lambda r, t, lv=lv: lv.pending.append(t)
        self.live[rid] = lv
        self.arrivals.append((sim.arrival, lv))
        self.wake.set()
        writer = ChunkWriter(rid, self.name, parsed)
        try:
            if not parsed.stream:
                return await self._whole(lv, writer)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "x-autotune-simulated": "true",
                                               "x-autotune-time-scale": str(self.scale),
                                               "x-autotune-sim-arrival": f"{arrival:.6f}"})
            await resp.prepare(request)
            while True:
                item = await lv.queue.get()
                if item is None:
                    return resp   # the engine died: the connection ends mid-stream
                sent, times, last = item
                text = "".join(token_text(i, self.seed) for i in range(sent - len(times), sent))
                await resp.write(writer.tokens(text, times, last, sent))
                if last:
                    await resp.write(writer.final(sent))
                    await resp.write_eof()
                    return resp
        except (ConnectionResetError, asyncio.CancelledError):
            self.arrivals = [(t, other) for t, other in self.arrivals if other is not lv]
            self.sched.abort(rid)
            raise
        finally:
            self.live.pop(rid, None)

    async def _whole(self, lv: _Live, writer: ChunkWriter) -> web.Response:
        first: float | None = None
        while True:
            item = await lv.queue.get()
            if item is None:
                return web.json_response(error_body("engine died", 500), status=500)
            sent, times, last = item
            first = times[0] if first is None and times else first
            if last:
                text = "".join(token_text(i, self.seed) for i in range(sent))
                out = writer.whole(text, sent)
                if lv.handoff:
                    out["kv_transfer_params"] = self._handoff(lv, first or 0.0)
                return web.json_response(out)

    # ---- disaggregated prefill/decode: NixlConnector's side of the protocol -----------------------
    def _kv_params(self, params: Any, prompt_len: int) -> tuple[bool, int, float]:
        """(answer with a hand-off, prompt tokens whose KV arrives from elsewhere, simulated seconds until
        it has arrived) for a request's `kv_transfer_params`. Without --kv-transfer-config they are
        ignored, as vLLM ignores them without a connector."""
        if not self.kv_transfer or not isinstance(params, dict):
            return False, 0, 0.0
        if params.get("do_remote_decode"):
            return True, 0, 0.0
        if params.get("do_remote_prefill") and prompt_len > 1:
            from autotune.perfmodel.disagg import transfer

            moved = transfer(self.plan, prompt_len, str(self.kv_transfer.get("kv_buffer_device", "cuda")))
            return False, prompt_len - 1, moved.seconds   # the last prompt token is computed here, as vLLM does
        return False, 0, 0.0

    def _handoff(self, lv: _Live, prefill_s: float) -> dict[str, Any]:
        """What a prefill instance answers for the decode instance (NixlConnector's field names); the
        simulated prefill time rides along so that the decode instance's token times count it."""
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_block_ids": list(range(-(-lv.sim.prompt_len // self.plan.config.block_size))),
                "remote_host": "127.0.0.1", "remote_port": 0, "tp_size": self.plan.config.tp,
                "autotune_sim": {"prefill_s": round(prefill_s, 6)}}
