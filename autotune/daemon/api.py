"""The daemon's HTTP face: `GET /status` (JSON), `GET /metrics` (Prometheus text), and `POST /submit`,
`POST /cancel` for `autotune submit|cancel --url`.

Loopback by default. Anything else hears the network, so it needs a token, read from `--token-file`
or `AUTOTUNE_TOKEN` (never from the command line, where `ps` shows it to every user), and every
request must carry `Authorization: Bearer TOKEN`. The server runs aiohttp on its own event loop in a
thread, beside the scheduler's worker threads.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from aiohttp import web

from autotune.errors import UserError

TOKEN_ENV = "AUTOTUNE_TOKEN"

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def parse_listen(text: str) -> tuple[str, int]:
    """`127.0.0.1:8321`, `[::1]:8321`, `0.0.0.0:8321`, or a bare port (loopback)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--listen {text!r}: give HOST:PORT, e.g. 127.0.0.1:8321")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise UserError(f"--token-file {token_file}: cannot read: {e.strerror}") from None
        if not token:
            raise UserError(f"--token-file {token_file} is empty")
        return token
    return environ.get(TOKEN_ENV) or None


def check_listen(listen: str, token: str | None) -> tuple[str, int]:
    host, port = parse_listen(listen)
    if not is_loopback(host) and not token:
        raise UserError(f"--listen {listen}: listening beyond loopback needs a token "
                        f"(--token-file FILE or {TOKEN_ENV}); clients send 'Authorization: Bearer TOKEN'")
    return host, port


class StatusServer:
    """Serves the callables it is given; they run in the server's thread and must be thread-safe."""

    def __init__(self, host: str, port: int, token: str | None, *, status: Callable[[], dict[str, Any]],
                 metrics: Callable[[], str], actions: Mapping[str, Handler]) -> None:
        self.host, self.port, self.token = host, port, token
        self._status, self._metrics, self._actions = status, metrics, dict(actions)
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="status-api", daemon=True)

    def start(self) -> None:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except OSError as e:
            self.stop()
            raise UserError(f"--listen {self.host}:{self.port}: {e.strerror or e}") from None

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/status", self._get_status)
        app.router.add_get("/metrics", self._get_metrics)
        for name in self._actions:
            app.router.add_post(f"/{name}", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:  # tests ask for any free port
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        return await handler(request)

    async def _get_status(self, request: web.Request) -> web.Response:
        body = await asyncio.to_thread(self._status)
        return web.Response(text=json.dumps(body, default=str, indent=1), content_type="application/json")

    async def _get_metrics(self, request: web.Request) -> web.Response:
        text = await asyncio.to_thread(self._metrics)
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def _post(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        handler = self._actions[request.path.lstrip("/")]
        try:
            return web.json_response(await asyncio.to_thread(handler, body), dumps=_dumps)
        except UserError as e:
            return web.json_response({"error": str(e)}, status=400)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
