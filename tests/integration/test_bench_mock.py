"""`autotune bench` over real HTTP on loopback, against the mock server whose behaviour is known."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import AsyncContextManager, AsyncIterator

import pytest
from aiohttp import web

from autotune.bench import find_capacity, parse_workload, run_load
from autotune.bench.capacity import reset_prefix_cache
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.bench.results import LoadStep
from autotune.errors import UserError
from autotune.slo import SLO
from autotune.tuner.measure import step_record

W = parse_workload("random:input_len=20,output_len=16")
# The mock shares this process's event loop with the client: on a busy machine both run late, every
# latency reads longer and every capacity lower (never the other way), and the client says so by flagging
# itself saturated (its latencies are not trusted). So a figure's lower latency / upper capacity bound
# holds always, its precise band only when the client kept time; benchmarks/ holds the precise figures.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mock(**kw) -> AsyncContextManager[str]:
    return serve(build_app(MockConfig(**kw)))


async def test_closed_loop_measures_the_batch_model():
    async with mock(mode="batch", step_ms=4, per_seq_ms=0.5) as url:
        m = await run_load(url, "mock", W, concurrency=8, num_requests=48, warmup=4, slo=SLO.parse("tpot:p50<=50ms"))
    x = m.metrics
    assert x["completed"] == 48 and x["failed"] == 0
    assert x["total_output_tokens"] == 48 * 16
    assert x["max_concurrent_requests"] == 8
    assert x["median_tpot_ms"] >= 0.9 * (4 + 0.5 * 8)                   # the model: 8 ms at batch 8 ...
    assert x["median_tpot_ms"] <= 1.1 * (4 + 0.5 * 8) or m.client.saturated   # ... when the client kept time
    assert x["output_throughput"] == pytest.approx(x["total_output_tokens"] / x["duration"])
    assert x["goodput"] == pytest.approx(x["request_throughput"]) and x["slo_attainment_pct"] == 100.0
    assert len(m.records) == 48
    # a quiet machine keeps up; a loaded one must say that it did not (its figures then carry the flag)
    assert not m.client.saturated or "event-loop lag" in m.client.note or "CPU" in m.client.note


async def test_failed_requests_are_counted_not_hidden():
    async with mock(mode="stream", itl_ms=1, fail_every=4) as url:
        m = await run_load(url, "mock", W, concurrency=4, num_requests=40, slo=SLO.parse("ttft=1s"))
    assert m.metrics["failed"] == 10 and m.metrics["completed"] == 30
    bad = [r for r in m.records if not r.ok]
    assert len(bad) == 10 and all("HTTP 500" in r.error for r in bad)
    assert m.metrics["slo_attainment_pct"] == pytest.approx(75.0)


async def test_chat_endpoint_and_open_loop_rate():
    async with mock(mode="stream", itl_ms=1) as url:
        m = await run_load(url, "mock", W, rate=100.0, num_requests=100, endpoint="chat", seed=3)
    assert m.metrics["completed"] == 100 and m.metrics["total_output_tokens"] == 1600
    # 100 Poisson arrivals at 100/s span about 1 s (+ one 16 ms stream)
    assert 0.7 < m.metrics["duration"] and (m.metrics["duration"] < 1.4 or m.client.saturated)
    assert m.load["mode"] == "rate" and m.metrics["request_rate"] == 100.0


async def test_duration_bound_run():
    async with mock(mode="stream", itl_ms=2) as url:
        m = await run_load(url, "mock", W, concurrency=4, duration_s=0.6)
    assert 0.55 < m.metrics["duration"]
    assert (m.metrics["duration"] < 0.8 and m.metrics["completed"] >= 40) or m.client.saturated


async def test_early_abort_cuts_an_overloaded_step():
    async with mock(mode="batch", step_ms=4, per_seq_ms=0.5, max_seqs=4) as url:
        m = await run_load(url, "mock", W, concurrency=64, num_requests=400, slo=SLO.parse("ttft:p99<=100ms"),
                           abort_on_slo=True)
    assert m.aborted_early and "ttft" in m.load["abort_reason"]
    assert m.metrics["completed"] < 100 and m.load["cancelled"] > 0
    # the trial's capacity record keeps which term ended the step, and how
    kept = step_record(LoadStep(load=64, measurement=m, slo_met=False))
    assert kept["aborted_early"] and kept["abort_reason"] == m.load["abort_reason"]
    assert kept["abort_reason"].startswith("ttft:p99<=100ms: ") and "over the limit" in kept["abort_reason"]


async def test_a_mean_bound_step_with_its_first_wave_kept_apart_ends_after_one_counted_wave():
    """A mean term has no 'certain' rule; the 'clear' one judges after two waves. With the first wave
    kept apart (`settle`, as every capacity step above one stream sends it) the second is the first
    counted one: waiting for two counted waves was every request of the step, never an early end."""
    async with mock(mode="batch", step_ms=4, per_seq_ms=0.5, max_seqs=64) as url:   # TPOT ~24 ms at 40
        m = await run_load(url, "mock", W, concurrency=40, num_requests=80, settle=40,
                           slo=SLO.parse("tpot:mean<=12ms"), abort_on_slo=True)
    assert m.aborted_early and m.load["abort_reason"].startswith("tpot:mean<=12ms: mean of ")
    assert 40 <= m.metrics["completed"] < 80 and m.load["cancelled"] > 0


async def test_capacity_search_finds_the_known_concurrency():
    # TPOT = 8 + 1 * batch ms; limit 48.5 ms: highest concurrency meeting it is 40. One stream is worth a
    # whole millisecond of TPOT, so the lag a busy box adds to every token moves the figure little (at
    # 0.25 ms a stream, 1.75 ms of unflagged lag once read 33)
    async with mock(mode="batch", step_ms=8, per_seq_ms=1) as url:
        r = await find_capacity(url, "mock", W, SLO.parse("tpot:p50<=48.5ms"), search="concurrency",
                                requests_per_step=120, warmup=8)
    assert len(r.steps) <= 6 and r.cache_reset
    assert r.capacity <= 41          # 40 on a quiet box; load on the shared cores only lowers it ...
    if "client_saturated" not in r.flags:
        assert 34 <= r.capacity      # ... and by this much at most while the client keeps up; past that the
                                     # search flags its own figures
    assert r.at_capacity is not None and r.at_capacity.metrics["median_tpot_ms"] <= 48.5


async def test_capacity_records_cache_not_reset_on_404():
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25, reset_cache=False) as url:
        r = await find_capacity(url, "mock", W, SLO.parse("tpot:p50<=4ms"), requests_per_step=20, max_steps=2)
    assert r.cache_reset is False


async def test_unreachable_server_is_a_user_error():
    with pytest.raises(UserError, match="cannot reach"):
        await run_load(f"http://127.0.0.1:{free_port()}", "m", W, concurrency=1, num_requests=1)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "bench", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, words", [
    (["--url", "http://127.0.0.1:1", "--model", "m", "--concurrency", "1"], "cannot reach"),
    (["--url", "localhost:8000", "--model", "m", "--concurrency", "1"], "not a base URL"),
    (["--url", "http://127.0.0.1:1", "--model", "m", "--concurrency", "one"], "invalid int"),
    (["--url", "http://127.0.0.1:1", "--model", "m", "--rate", "-3"], "must be > 0"),
    (["--url", "http://127.0.0.1:1", "--model", "m"], "give a load"),
    (["--url", "http://127.0.0.1:1", "--model", "m", "--concurrency", "1", "--slo", "ttft<1s"], "SLO term"),
    (["--url", "http://127.0.0.1:1", "--model", "m", "--capacity", "rate"], "needs --slo"),
    (["--model", "m"], "required"),
])
def test_cli_errors_are_one_line_exit_2(args, words):
    p = cli(*args)
    assert p.returncode == 2
    assert words in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_cli_json_uses_vllm_keys(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "autotune.bench.mockserver", "--port", str(port),
                               "--mode", "stream", "--itl-ms", "1"], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time
        import urllib.request
        for _ in range(600):                  # up to a minute for the server to answer
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        out = tmp_path / "r.json"
        p = cli("--url", f"http://127.0.0.1:{port}", "--model", "mock", "--concurrency", "4", "--num-requests", "20",
                "--warmup", "2", "--slo", "ttft=1s", "--json", str(out), "--workload", "random:input_len=8,output_len=8")
        assert p.returncode == 0, p.stderr
        assert "Output token throughput" in p.stdout
        data = json.loads(out.read_text())
        for key in ("output_throughput", "request_throughput", "total_token_throughput", "median_ttft_ms",
                    "p99_ttft_ms", "median_tpot_ms", "mean_itl_ms", "p99_e2el_ms", "completed", "failed",
                    "duration", "max_concurrent_requests", "goodput", "slo_attainment_pct", "max_concurrency"):
            assert key in data, key
        assert data["completed"] == 20 and data["total_output_tokens"] == 160
        assert len(data["requests"]) == 20 and data["requests"][0]["ok"] is True
        assert data["request_rate"] == "inf"
    finally:
        server.terminate()
        server.wait(timeout=10)


@asynccontextmanager
async def reset_server(answers: list[tuple[int, str]]) -> AsyncIterator[tuple[str, list[int]]]:
    """A server whose /reset_prefix_cache gives `answers` (status, body) in turn, the last one from then
    on. (A fresh response each time: aiohttp cannot send one response object twice, and a second send
    of the same one left the client waiting for its 30 s timeout instead of reading a refusal.)"""
    calls: list[int] = []

    async def reset(_: web.Request) -> web.Response:
        calls.append(1)
        status, body = answers[min(len(calls), len(answers)) - 1]
        return web.Response(status=status, text=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/reset_prefix_cache", reset)
    async with serve(app) as url:
        yield url, calls


async def test_a_refused_reset_is_retried_until_the_server_has_drained():
    # vLLM answers 200 {"success": false} while blocks are still held (a cut-short step's requests)
    refused, done = (200, '{"success": false}'), (200, '{"success": true}')
    async with reset_server([refused, refused, done]) as (url, calls):
        assert await reset_prefix_cache(url, wait_s=10) is True
    assert len(calls) == 3


async def test_a_reset_refused_past_the_wait_is_recorded_as_not_reset():
    async with reset_server([(200, '{"success": false}')]) as (url, calls):
        assert await reset_prefix_cache(url, wait_s=1.2) is False
    assert 2 <= len(calls) <= 5


async def test_reset_answers_of_older_servers():
    async with reset_server([(200, "")]) as (url, calls):
        assert await reset_prefix_cache(url) is True       # an empty 200: done
    async with reset_server([(404, "Not Found")]) as (url, calls):
        assert await reset_prefix_cache(url) is False


async def test_each_capacity_step_draws_its_own_prompts(monkeypatch):
    # if a reset fails anyway, no step may replay an earlier step's prompts from the prefix cache
    import autotune.bench.capacity as capacity
    seeds: list[int] = []
    real = capacity.run_load

    async def spy(*a, **kw):
        seeds.append(kw["seed"])
        return await real(*a, **kw)

    monkeypatch.setattr(capacity, "run_load", spy)
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
        r = await find_capacity(url, "mock", W, SLO.parse("tpot:p50<=12.125ms"), requests_per_step=60,
                                warmup=4, max_steps=4, seed=5)
    assert len(seeds) == len(r.steps) >= 3 and len(set(seeds)) == len(seeds) and seeds[0] == 5
    prompts = [W.prompts(64, seed=s) for s in seeds]   # warm-up + measured
    assert not {p.text for p in prompts[0]} & {p.text for p in prompts[1]}


async def test_capacity_search_resets_the_cache_after_a_cut_short_step():
    # TTFT limit broken hard at high concurrency: steps are cut short with requests in flight; the
    # mock (like vLLM) refuses a reset until those have left the batch, and the search waits for it
    async with mock(mode="batch", step_ms=4, per_seq_ms=0.5, max_seqs=8) as url:
        r = await find_capacity(url, "mock", W, SLO.parse("ttft:p99<=60ms"), requests_per_step=200, warmup=4,
                                max_steps=4)
        import aiohttp
        async with aiohttp.ClientSession() as s, s.get(url + "/mock/resets") as resp:
            resets = await resp.json()
    assert any(s.measurement.aborted_early for s in r.steps)
    assert r.cache_reset is True and resets[-1] is True and len(resets) >= len(r.steps)


async def test_a_capacity_search_says_when_the_cache_served_random_prompts(monkeypatch):
    import autotune.bench.runner as runner
    monkeypatch.setattr(runner, "prefix_hit_pct", lambda before, after: 40.0)
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
        r = await find_capacity(url, "mock", W, SLO.parse("tpot:p50<=12.125ms"), requests_per_step=40,
                                warmup=4, max_steps=2)
    assert all(s.measurement.metrics["prefix_cache_hit_pct"] == 40.0 for s in r.steps)
    assert "prefix cache served random prompts" in r.note and "flattered" in r.note


async def test_steady_throughput_does_not_depend_on_where_the_last_wave_falls():
    # 40 streams on a server whose step costs 2 + 0.25 x 40 ms: 1.1 waves and 4 whole waves give the
    # same steady figure; the whole-run average of the short step is dragged down by its tail
    w = parse_workload("random:input_len=20,output_len=64")
    got, runs = {}, {}
    for n in (44, 160):
        async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
            runs[n] = await run_load(url, "mock", w, concurrency=40, num_requests=n)
            got[n] = runs[n].metrics
    s44, s160 = got[44]["steady_output_throughput"], got[160]["steady_output_throughput"]
    assert s160 < 1.01 * 40 / 0.012                               # at most the server's 3,333 tok/s
    if not any(m.client.saturated for m in runs.values()):        # the precise figures, when the client kept time
        assert abs(s44 / s160 - 1) < 0.10       # 0.06 failed at 0.064 unflagged, three jobs on two cores
        assert got[44]["output_throughput"] < 0.95 * s44
        assert 0.85 * 40 / 0.012 < s160


async def test_a_step_sends_on_connections_opened_before_its_clock():
    """Every measured request rides a socket the client opened before the step began (a socket made
    inside the window stalled the loop tens of ms on the GPU host and flagged the step)."""
    seen: list[tuple[str, int]] = []

    @web.middleware
    async def peer(request: web.Request, handler):
        seen.append((request.path, request.transport.get_extra_info("peername")[1]))
        return await handler(request)

    app = build_app(MockConfig(mode="stream", itl_ms=1))
    app.middlewares.append(peer)
    async with serve(app) as url:
        m = await run_load(url, "mock", W, concurrency=8, num_requests=32, slo=SLO.parse("ttft=1s"))
    assert m.metrics["completed"] == 32
    first_path: dict[int, str] = {}
    for path, port in seen:
        first_path.setdefault(port, path)
    sent_on = {port for path, port in seen if path == "/v1/completions"}
    assert sent_on and all(first_path[port] != "/v1/completions" for port in sent_on)
    assert len(sent_on) <= 8
