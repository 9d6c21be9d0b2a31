"""The streaming client's timing definitions, checked against a scripted SSE stream on loopback.

They are the definitions of `vllm bench serve` (vLLM 0.32.0, `async_request_openai_completions` and
`calculate_metrics`), so the two clients agree on the same stream:
- the clock starts right before the POST; TTFT ends at the first chunk that has `choices`, even when its
  text is empty (vLLM's server sends a chunk per token, and on a small BPE vocabulary a token often
  decodes to "" until the next one completes a character);
- E2EL ends at the last chunk with `choices`; the trailing usage chunk (`choices: []`) does not move it;
- the output token count is the server's `usage.completion_tokens`, not the number of chunks, so TPOT =
  (E2EL - TTFT) / (completion_tokens - 1).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncContextManager

import pytest
from aiohttp import web

from autotune.bench.client import StreamClient
from autotune.bench.mockserver import serve
from autotune.bench.workloads import Prompt

GAP_S = 0.05   # between scripted events


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _choice(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}


# (delay before the event in gaps, event). First token decodes to "", one chunk carries two tokens,
# so there are 4 chunks with choices but 5 tokens; then the usage chunk, one gap after the last token.
SCRIPT: list[tuple[int, bytes]] = [
    (2, _event(_choice(""))),
    (1, _event(_choice("a"))),
    (1, _event(_choice("bc"))),
    (1, _event(_choice("d"))),
    (1, _event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}})),
    (0, b"data: [DONE]\n\n"),
]


def _server(written: list[float]) -> AsyncContextManager[str]:
    """The scripted stream; `written` gets the moment each event is written (perf_counter, the client's
    clock). Server and client share one event loop, so the client has read an event before the server
    writes the next: each client timestamp falls between two of these, however late a busy machine
    runs both."""
    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream"] and body["stream_options"] == {"include_usage": True}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for gaps, data in SCRIPT:
            await asyncio.sleep(gaps * GAP_S)
            written.append(time.perf_counter())
            await resp.write(data)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    return serve(app)


async def test_first_token_is_the_first_chunk_with_choices_even_if_its_text_is_empty() -> None:
    written: list[float] = []
    async with _server(written) as url, StreamClient(url, "m") as client:
        r = await client.request(Prompt(text="x", input_tokens=7, output_len=5))
    assert r.ok
    first, last = r.start_s + r.ttft_ms / 1000, r.start_s + r.e2el_ms / 1000
    assert r.ttft_ms >= 2 * GAP_S * 1000 - 1                           # the first event comes 2 gaps in
    assert written[0] <= first <= written[1] + 1e-6                    # the "" chunk, not the "a" one
    assert len(r.itl_ms) == 3                                          # 4 chunks with choices
    assert written[3] <= last <= written[4] + 1e-6                     # last token, not the usage chunk


async def test_tpot_divides_by_the_servers_token_count_not_the_chunk_count() -> None:
    written: list[float] = []
    async with _server(written) as url, StreamClient(url, "m") as client:
        r = await client.request(Prompt(text="x", input_tokens=7, output_len=5))
    assert r.output_tokens == 5 and r.input_tokens == 7
    assert r.ttft_ms is not None and r.e2el_ms is not None and r.tpot_ms is not None
    assert r.tpot_ms == pytest.approx((r.e2el_ms - r.ttft_ms) / 4)
    # from the "" chunk to the "d" one (3 gaps when nothing is late), over 4 tokens, not 3 chunks
    assert (written[3] - written[1]) / 4 - 1e-6 <= r.tpot_ms / 1000 <= (written[4] - written[0]) / 4 + 1e-6
