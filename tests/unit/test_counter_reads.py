"""The server's /metrics counters are read on both sides of a run (bench/runner.py: prefix_counters); a
read that fails is tried again, so one late or refused answer on a busy host does not cost the run its
acceptance rate and prefix-cache share. A server without /metrics (404) is asked once."""

from __future__ import annotations

import socket
from typing import AsyncIterator, Callable

import pytest
from aiohttp import web

import autotune.bench.runner as runner
from autotune.bench.client import StreamClient

SPEC_PAGE = ('vllm:spec_decode_num_drafts_total{engine="0"} 7\n'
             'vllm:spec_decode_num_draft_tokens_total{engine="0"} 21\n'
             'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 3\n')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(answers: list[int]) -> tuple[web.AppRunner, str, list[int]]:
    """A /metrics that gives the statuses in `answers` in turn (the page with the last, 200), counting asks."""
    asked: list[int] = []

    async def metrics(_: web.Request) -> web.Response:
        status = answers[min(len(asked), len(answers) - 1)]
        asked.append(status)
        return web.Response(text=SPEC_PAGE if status == 200 else "", status=status)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app_runner = web.AppRunner(app)
    await app_runner.setup()
    port = _free_port()
    await web.TCPSite(app_runner, "127.0.0.1", port).start()
    return app_runner, f"http://127.0.0.1:{port}", asked


@pytest.fixture
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "COUNTER_RETRY_PAUSE_S", 0.0)


@pytest.fixture
async def server() -> AsyncIterator[Callable]:
    started: list[web.AppRunner] = []

    async def start(answers: list[int]) -> tuple[str, list[int]]:
        app_runner, url, asked = await _serve(answers)
        started.append(app_runner)
        return url, asked

    yield start
    for app_runner in started:
        await app_runner.cleanup()


async def _read(url: str, **kw) -> runner.VllmReading | None:
    async with StreamClient(url, "m") as client:
        return await runner.prefix_counters(client, **kw)


async def test_a_failed_read_is_tried_again(server, no_pause) -> None:
    url, asked = await server([503, 500, 200])
    reading = await _read(url)
    assert asked == [503, 500, 200]
    assert reading is not None and reading.spec_draft_tokens_total == 21 and reading.spec_accepted_total == 3


async def test_the_tries_are_bounded(server, no_pause) -> None:
    url, asked = await server([503])
    assert await _read(url, attempts=3) is None
    assert asked == [503, 503, 503]


async def test_a_server_without_metrics_is_asked_once(server, no_pause) -> None:
    url, asked = await server([404])
    assert await _read(url) is None
    assert asked == [404]


async def test_a_refused_connection_is_tried_again_then_given_up(no_pause) -> None:
    assert await _read(f"http://127.0.0.1:{_free_port()}", attempts=2) is None
