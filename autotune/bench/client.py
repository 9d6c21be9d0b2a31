"""The streaming HTTP client: one request in, one timed `RequestRecord` out.

aiohttp directly rather than httpx's default transport: on 2 cores the pure-Python HTTP/1.1 stack of
httpx tops out near 15k SSE events/s, aiohttp's C parser carries several times that (REFERENCE.md §2).
Each network read is timestamped once, on arrival, before any parsing, so parse cost never shows up as
server latency; events that arrived together share that timestamp (ITL 0), which is what happened.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Iterable

import aiohttp

from autotune.bench.results import RequestRecord
from autotune.bench.tokens import Tokenizer
from autotune.bench.workloads import Prompt
from autotune.errors import UserError

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class Live:
    """A request in flight, visible to the early-abort check (a request still waiting for its first
    token past the TTFT limit has already broken it); `images` tells its class."""

    start: float
    first: float | None = None
    images: int = 0


STALLED = "stalled"   # the error of a request that received nothing for stall_timeout_s


def stalled_requests(records: Iterable[RequestRecord]) -> int:
    """How many requests the server stopped answering (a hung server, not a slow one)."""
    return sum(1 for r in records if not r.ok and (r.error or "").startswith(STALLED))


class StreamClient:
    """One connection pool for a whole load run; `request()` is safe to call concurrently."""

    def __init__(self, base_url: str, model: str, *, endpoint: str = "completions", timeout_s: float = 600,
                 tokenizer: Tokenizer | None = None, stall_timeout_s: float | None = None,
                 api_key: str | None = None) -> None:
        if endpoint not in ENDPOINTS:
            raise UserError(f"endpoint {endpoint!r} is unknown (one of {', '.join(ENDPOINTS)})")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + ENDPOINTS[endpoint]
        self.model, self.endpoint, self.tokenizer = model, endpoint, tokenizer
        # `stall_timeout_s`: no byte for that long (before the first token or between two) fails the request,
        # so a server that stops answering mid-stream ends a load step instead of holding it for timeout_s.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=stall_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        # vLLM started with --api-key guards /v1/*: the key is sent, never logged or stored
        self._headers = {"Content-Type": "application/json",
                         **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        # The simulator (`autotune sim-serve`) runs faster than wall time and says so in a header; its
        # chunks carry each token's simulated time, which then replaces the wall clock's timing.
        self.time_scale = 1.0
        self.sim_span: tuple[float, float] | None = None   # simulated (first arrival, last token)

    async def __aenter__(self) -> "StreamClient":
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60), timeout=self._timeout,
            headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use StreamClient as an async context manager"
        return self._session

    async def open_connections(self, n: int, path: str = "/health") -> int:
        """Open `n` kept-alive connections before a step's clock starts; returns how many answered.

        Why: each step's client is new, so a closed loop at concurrency 53 opened 49 sockets inside its
        measured window. On the 16-core GPU host the socket() call itself stalled the event loop 25-50 ms
        (18 of 35 stalls caught at 8 slots, 2026-12-02, with no other thread running and no CPU wait), and
        each such stall flagged the step `client_saturated`. A production client keeps its connections
        open too, so a request's time starts at the request, not at a TCP handshake. Any HTTP answer
        keeps its connection; one that fails is left to the step, which opens what it lacks."""
        if n <= 0:
            return 0

        async def one() -> bool:
            try:
                async with self.session.get(self.base_url + path, timeout=aiohttp.ClientTimeout(total=10)) as r:
                    await r.read()
                return True
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                return False

        return sum(await asyncio.gather(*(one() for _ in range(n))))

    def payload(self, prompt: Prompt) -> bytes:
        """The request body. `ignore_eos` with a fixed length, as benchmarks must: a random-weight or
        chatty model would otherwise stop at a whim and the output length would measure the model."""
        body: dict[str, Any] = {"model": self.model, "stream": True, "ignore_eos": True,
                                "stream_options": {"include_usage": True}}
        if self.endpoint == "chat":
            body["messages"] = chat_messages(prompt)
            body["max_completion_tokens"] = prompt.output_len
        else:
            if prompt.images:
                raise UserError("requests with images go to the chat endpoint: use --endpoint chat "
                                "(load.endpoint: chat in a study)")
            body["prompt"] = prompt.text
            body["max_tokens"] = prompt.output_len
        return json.dumps(body).encode()

    async def request(self, prompt: Prompt, live: Live | None = None, scheduled: float | None = None) -> RequestRecord:
        """`scheduled`: when an open loop meant this request to go out; kept beside the actual start."""
        rec = await self._request(prompt, live)
        rec.scheduled_s = scheduled
        return rec

    async def _request(self, prompt: Prompt, live: Live | None) -> RequestRecord:
        body = self.payload(prompt)
        chat = self.endpoint == "chat"
        loads, perf = json.loads, time.perf_counter
        start = perf()
        if live is not None:
            live.start = start
        first: float | None = None
        last = start
        itl: list[float] = []
        pieces: list[str] = []
        chunks = 0
        usage: dict[str, Any] | None = None
        error: str | None = None
        sim_times: list[float] = []
        try:
            async with self.session.post(self.url, data=body) as resp:
                if "x-autotune-time-scale" in resp.headers:
                    self.time_scale = float(resp.headers["x-autotune-time-scale"])
                sim_arrival = float(resp.headers.get("x-autotune-sim-arrival", "nan"))
                if resp.status != 200:
                    text = (await resp.text())[:200].replace("\n", " ")
                    return self._failed(prompt, start, f"HTTP {resp.status}: {text}")
                buf = b""
                async for data in resp.content.iter_any():
                    now = perf()
                    buf += data
                    if b"\n" not in data:
                        continue
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]" or not payload:
                            continue
                        obj = loads(payload)
                        if "error" in obj and obj["error"]:
                            error = _one_line(obj["error"])
                            continue
                        choices = obj.get("choices")
                        if choices:
                            c0 = choices[0]
                            text = (c0.get("delta") or {}).get("content") if chat else c0.get("text")
                            if first is None:
                                first = now
                                if live is not None:
                                    live.first = now
                            else:
                                itl.append((now - last) * 1000.0)
                            last = now
                            chunks += 1
                            if text:
                                pieces.append(text)
                        u = obj.get("usage")
                        if u:
                            usage = u
                        sim = obj.get("autotune_sim")
                        if sim:
                            sim_times += sim.get("token_times_s") or []
        except aiohttp.SocketTimeoutError:  # sock_read: the server stopped answering this stream
            return self._failed(prompt, start, f"{STALLED}: no byte for {self._timeout.sock_read:g} s")
        except Exception as e:  # noqa: BLE001 - every transport failure is a failed request, counted
            return self._failed(prompt, start, _one_line(e) or type(e).__name__)
        if error is not None or first is None:
            return self._failed(prompt, start, error or "stream ended without a token")
        out_tokens = self._output_tokens(usage, pieces, chunks)
        in_tokens = (usage or {}).get("prompt_tokens") or prompt.input_tokens or 0
        if sim_times:  # simulated seconds since the request arrived
            if sim_arrival == sim_arrival:  # not NaN
                lo, hi = self.sim_span or (sim_arrival, sim_arrival)
                self.sim_span = (min(lo, sim_arrival), max(hi, sim_arrival + sim_times[-1]))
            return RequestRecord(start_s=start, ttft_ms=sim_times[0] * 1000.0, e2el_ms=sim_times[-1] * 1000.0,
                                 itl_ms=[(b - a) * 1000.0 for a, b in zip(sim_times, sim_times[1:])],
                                 input_tokens=int(in_tokens), output_tokens=out_tokens, ok=True,
                                 images=len(prompt.images))
        return RequestRecord(start_s=start, ttft_ms=(first - start) * 1000.0, e2el_ms=(last - start) * 1000.0,
                             itl_ms=itl, input_tokens=int(in_tokens), output_tokens=out_tokens, ok=True,
                             images=len(prompt.images))

    def _output_tokens(self, usage: dict[str, Any] | None, pieces: list[str], chunks: int) -> int:
        """The server's count when it gives one; else the tokenizer's; else one token per chunk."""
        if usage and usage.get("completion_tokens"):
            return int(usage["completion_tokens"])
        if self.tokenizer is not None:
            return len(self.tokenizer.encode("".join(pieces)))
        return chunks

    @staticmethod
    def _failed(prompt: Prompt, start: float, error: str) -> RequestRecord:
        return RequestRecord(start_s=start, ttft_ms=None, e2el_ms=None, itl_ms=[],
                             input_tokens=prompt.input_tokens or 0, output_tokens=0, ok=False, error=error,
                             images=len(prompt.images))


def chat_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """The request's chat messages, each image an `image_url` content part of its message (the last user
    message when it names none), ahead of that message's text."""
    messages: list[dict[str, Any]] = [dict(m) for m in prompt.messages] if prompt.messages else \
        [{"role": "user", "content": prompt.text}]
    if not prompt.images:
        return messages
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    default = users[-1] if users else len(messages) - 1
    parts: dict[int, list[dict[str, Any]]] = {}
    for img in prompt.images:
        at = img.message if img.message is not None and 0 <= img.message < len(messages) else default
        parts.setdefault(at, []).append({"type": "image_url", "image_url": {"url": img.url}})
    for at, images in parts.items():
        text = messages[at].get("content") or ""
        messages[at]["content"] = images + ([{"type": "text", "text": text}] if text else [])
    return messages


def _one_line(err: object) -> str:
    if isinstance(err, dict):
        err = err.get("message", err)
    return str(err).strip().replace("\n", " ")[:300]
