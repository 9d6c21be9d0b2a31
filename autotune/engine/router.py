"""The router in front of a prefill/decode deployment (`autotune router`): one OpenAI endpoint for the
load client, speaking to the instances the protocol of vLLM's own disaggregated proxy for NixlConnector
(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py in vLLM), so it serves real vLLM instances
as it serves the simulator's:

1. the request goes to a prefill instance (round robin) as a non-streamed request for one token, with
   `kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false, remote_*: null}`, without
   `stream_options`/`min_tokens`, and an `X-Request-Id` shared by both legs;
2. the `kv_transfer_params` of its answer (the prefill's engine id, block ids, host and port) go into
   the original request, which goes to a decode instance (round robin); its answer, streamed or not,
   is passed back byte for byte with its status.

`/health` is 200 only when every instance answers 200; `/reset_prefix_cache` reaches every instance;
`/v1/models`, `/version` and `/metrics` are the first decode instance's; `/sim/telemetry` joins every
instance's GPUs (the simulator's telemetry), numbered in instance order.

    autotune router --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import signal
import sys
import uuid
from typing import Any, Iterator, Sequence

import aiohttp
from aiohttp import web

log = logging.getLogger("autotune.router")
PASSED_HEADERS = ("content-type", "cache-control")     # and every x-autotune-* header (the simulator's)
_HEALTH_TIMEOUT_S = 2.0


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg of a request: one token, not streamed, asking the instance to keep the KV for a
    remote decode (field names as vLLM's NixlConnector reads them)."""
    out = dict(body)
    out["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(key, None)
    return out


def decode_body(body: dict[str, Any], handoff: Any) -> dict[str, Any]:
    """The decode leg: the original request with the prefill's kv_transfer_params (when it gave any)."""
    out = dict(body)
    if isinstance(handoff, dict) and handoff:
        out["kv_transfer_params"] = handoff
    return out


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "RouterError", "param": None, "code": status}},
                             status=status)


class Router:
    """Round robin over the prefill and the decode pools; one aiohttp session for all upstream calls."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str]):
        if not prefill or not decode:
            raise ValueError("a router needs at least one prefill and one decode instance")
        self.prefill = [u.rstrip("/") for u in prefill]
        self.decode = [u.rstrip("/") for u in decode]
        self._next_prefill: Iterator[str] = itertools.cycle(self.prefill)
        self._next_decode: Iterator[str] = itertools.cycle(self.decode)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                  timeout=aiohttp.ClientTimeout(total=None), trust_env=False)
        return self._session

    async def close(self, _: web.Application | None = None) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.first_decode)
        app.router.add_get("/version", self.first_decode)
        app.router.add_get("/metrics", self.first_decode)
        app.router.add_get("/sim/telemetry", self.telemetry)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.on_cleanup.append(self.close)
        return app

    # ---- the two legs --------------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("request body is not JSON", 400)
        if not isinstance(body, dict):
            return _error("request body must be a JSON object", 400)
        path = request.path
        headers = {"X-Request-Id": request.headers.get("X-Request-Id") or f"pd-{uuid.uuid4().hex}"}
        if request.headers.get("Authorization"):
            headers["Authorization"] = request.headers["Authorization"]
        prefill = next(self._next_prefill)
        try:
            async with self.session.post(prefill + path, json=prefill_body(body), headers=headers) as resp:
                data = await resp.read()
                if resp.status != 200:   # the prefill's refusal (a bad request, a dead engine) is the answer
                    return web.Response(status=resp.status, body=data, content_type=resp.content_type)
            handoff = json.loads(data).get("kv_transfer_params")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError) as e:
            log.warning("prefill instance %s failed: %s: %s", prefill, type(e).__name__, e)
            return _error(f"prefill instance {prefill} failed: {type(e).__name__}: {e}", 502)
        decode = next(self._next_decode)
        try:
            async with self.session.post(decode + path, json=decode_body(body, handoff), headers=headers) as resp:
                out = web.StreamResponse(status=resp.status, headers={
                    k: v for k, v in resp.headers.items()
                    if k.lower() in PASSED_HEADERS or k.lower().startswith("x-autotune-")})
                await out.prepare(request)
                try:
                    async for chunk in resp.content.iter_any():
                        await out.write(chunk)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    # the answer has begun: no error response can follow it. Cut the client's connection,
                    # as the decode instance's death cut ours, so the request fails now, not at a timeout
                    log.warning("decode instance %s failed mid-answer: %s: %s", decode, type(e).__name__, e)
                    if request.transport is not None:
                        request.transport.abort()
                    return out
                await out.write_eof()
                return out
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            log.warning("decode instance %s failed: %s: %s", decode, type(e).__name__, e)
            return _error(f"decode instance {decode} failed: {type(e).__name__}: {e}", 502)

    # ---- the rest of vLLM's endpoints ---------------------------------------------------------------
    async def _get(self, url: str) -> tuple[int, bytes, str]:
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=_HEALTH_TIMEOUT_S)) as resp:
                return resp.status, await resp.read(), resp.content_type
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return 503, f"{type(e).__name__}: {e}".encode(), "text/plain"

    async def health(self, _: web.Request) -> web.Response:
        urls = [*self.prefill, *self.decode]
        answers = await asyncio.gather(*(self._get(u + "/health") for u in urls))
        down = [u for u, (status, _, _) in zip(urls, answers) if status != 200]
        return web.Response(status=503, text="not ready: " + ", ".join(down)) if down else web.Response(status=200)

    async def first_decode(self, request: web.Request) -> web.Response:
        status, data, ctype = await self._get(self.decode[0] + request.path)
        return web.Response(status=status, body=data, content_type=ctype)

    async def reset_prefix_cache(self, _: web.Request) -> web.Response:
        async def post(url: str) -> int:
            try:
                async with self.session.post(url + "/reset_prefix_cache") as resp:
                    return resp.status
            except aiohttp.ClientError:
                return 503
        codes = await asyncio.gather(*(post(u) for u in [*self.prefill, *self.decode]))
        return web.Response(status=200 if all(c == 200 for c in codes) else 503)

    async def telemetry(self, _: web.Request) -> web.Response:
        answers = await asyncio.gather(*(self._get(u + "/sim/telemetry") for u in [*self.prefill, *self.decode]))
        gpus: list[dict[str, Any]] = []
        doc: dict[str, Any] = {"simulated": True, "time_s": 0.0, "gpus": gpus}
        for status, data, _ in answers:
            if status != 200:
                return web.Response(status=503, text="an instance's telemetry is unavailable")
            one = json.loads(data)
            doc["gpu"] = one.get("gpu")
            doc["time_s"] = max(doc["time_s"], float(one.get("time_s") or 0.0))
            gpus += [{**g, "index": len(gpus) + i} for i, g in enumerate(one.get("gpus") or [])]
        return web.json_response(doc)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autotune router", description="prefill/decode router (NixlConnector protocol)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefill", nargs="+", required=True, help="base URLs of the prefill instances")
    p.add_argument("--decode", nargs="+", required=True, help="base URLs of the decode instances")
    return p


def main(argv: list[str]) -> int:
    """Serve until SIGTERM/SIGINT (a stop, or the parent-death signal of the tuner that started it)."""
    ns = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s router: %(message)s",
                        datefmt="%m-%d %H:%M:%S", stream=sys.stdout)
    return asyncio.run(_serve(ns))


async def _serve(ns: argparse.Namespace) -> int:
    router = Router(ns.prefill, ns.decode)
    runner = web.AppRunner(router.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, ns.host, ns.port).start()
    except OSError as e:
        log.error("[Errno 98] could not bind %s:%d: %s", ns.host, ns.port, e)
        await runner.cleanup()
        return 1
    log.info("routing prefill %s, decode %s", " ".join(router.prefill), " ".join(router.decode))
    log.info("Starting router on http://%s:%d", ns.host, ns.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("Shutting down router.")
    await runner.cleanup()
    return 0
