"""Trace replay over real HTTP on loopback, against the mock server whose behaviour is known: requests go
out at their recorded times (the drift is measured and bounded), later turns follow the answer they
continue, time_scale compresses the trace, and the capacity search by rate scaling finds the speed-up at
which the batch model's slots run out."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from autotune.bench import find_capacity, parse_workload, run_load
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.slo import SLO

# The bound on the send-time error (as in tests/conftest.py, replay_on_schedule): half the median gap
# between requests. A request that leaves less than half a gap late cannot swap places with its
# neighbour and a burst still reaches the server as a burst, so what the server sees is the trace's
# order and shape; a client that fell behind a burst (sending its requests one by one as it gets round
# to them) would be late by many gaps.
DRIFT_BOUND_GAPS = 0.5


def bursty_trace(path: Path, bursts: int = 6, per_burst: int = 8, gap_s: float = 0.05, every_s: float = 0.6,
                 output_tokens: int = 8) -> Path:
    lines = [{"t": b * every_s + k * gap_s, "output_tokens": output_tokens, "input_tokens": 16}
             for b in range(bursts) for k in range(per_burst)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def send_offsets(m) -> np.ndarray:
    starts = np.sort([r.start_s for r in m.records])
    return starts - starts[0]


async def test_a_bursty_trace_goes_out_on_schedule(tmp_path: Path, replay_on_schedule) -> None:
    w = parse_workload(f"trace:path={bursty_trace(tmp_path / 't.jsonl')}")
    runs = []

    async def replay():
        runs.append(await run_load(url, "mock", w))
        return runs[-1].metrics, asdict(runs[-1].client)

    async with serve(build_app(MockConfig(mode="stream", itl_ms=2))) as url:
        await replay_on_schedule(replay)
    m = runs[-1]
    x = m.metrics
    assert x["completed"] == 48 and m.load["mode"] == "trace" and m.load["time_scale"] == 1.0
    assert all(r.scheduled_s is not None for r in m.records)
    recorded = np.array(sorted(p.at_s for p in w.one_pass(None)))
    assert x["median_send_gap_ms"] == pytest.approx(50.0, abs=0.5)
    assert np.abs(send_offsets(m) - recorded).max() < 0.05          # every send within one gap of its time


async def test_time_scale_compresses_the_trace(tmp_path: Path) -> None:
    w = parse_workload(f"trace:path={bursty_trace(tmp_path / 't.jsonl')},time_scale=0.5")
    async with serve(build_app(MockConfig(mode="stream", itl_ms=1))) as url:
        m = await run_load(url, "mock", w)
    span = 5 * 0.6 + 7 * 0.05
    scheduled = sorted(r.scheduled_s for r in m.records)
    assert scheduled[-1] - scheduled[0] == pytest.approx(0.5 * span, abs=1e-6)         # the schedule, compressed
    assert send_offsets(m)[-1] == pytest.approx(0.5 * span, abs=0.02) or m.client.saturated   # the sends on it
    assert m.metrics["request_rate"] == pytest.approx(47 / (0.5 * span), rel=0.01)


async def test_later_turns_follow_the_answer_plus_think_time(tmp_path: Path) -> None:
    # one conversation of three turns, told apart by the words of their last message (the mock's input
    # count); each answer takes ~50 ms + 8 tokens; the recorded times say nothing of when to send turn 2
    history: list[dict] = []
    lines = []
    for k, words in enumerate((3, 5, 7)):
        history = history + [{"role": "user", "content": " ".join(["w"] * words)}]
        lines.append({"t": 0.01 * k, "output_tokens": 8, "messages": history, "conversation": "a", "turn": k,
                      **({"think_s": 0.1} if k else {})})
        history = history + [{"role": "assistant", "content": "ok"}]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    async with serve(build_app(MockConfig(mode="stream", ttft_ms=50, itl_ms=2))) as url:
        m = await run_load(url, "mock", parse_workload(f"trace:path={path}"), endpoint="chat")
    by_turn = {r.input_tokens: r for r in m.records}
    assert sorted(by_turn) == [3, 5, 7]
    for a, b in ((3, 5), (5, 7)):
        answered = by_turn[a].start_s + by_turn[a].e2el_ms / 1000
        assert by_turn[b].scheduled_s == pytest.approx(answered + 0.1, abs=0.005)
        assert by_turn[b].start_s >= answered + 0.1 - 0.001


async def test_capacity_by_rate_scaling_finds_where_the_batch_slots_run_out(tmp_path: Path) -> None:
    # evenly spaced requests every 200 ms, 10 tokens each; the batch model runs at most 4 at a time at
    # 20 + 2 * 4 = 28 ms a step, 280 ms a request, so it serves one request per 70 ms: beyond x = 200 / 70 =
    # 2.86 times the recorded rate a queue builds, by 200/x - 70 ms a request. TTFT is one step (~25 ms)
    # below that; the median request (the 19th of 38) waits past a 150 ms limit from about x = 3.2. The
    # median, and steps this slow, so that a few requests the loaded machine delays cannot decide it (and
    # a step cut short by the abort has finished half its requests: its margin says how far it broke).
    path = tmp_path / "even.jsonl"
    path.write_text("".join(json.dumps({"t": 0.2 * i, "output_tokens": 10, "input_tokens": 8}) + "\n"
                            for i in range(40)))
    w = parse_workload(f"trace:path={path}")
    async with serve(build_app(MockConfig(mode="batch", step_ms=20, per_seq_ms=2, max_seqs=4))) as url:
        r = await find_capacity(url, "mock", w, SLO.parse("ttft:p50<=150ms"), search="time_scale", max_steps=6,
                                requests_per_step=200, warmup=2)
    assert r.mode == "time_scale" and r.capacity is not None
    assert r.capacity < 3.6, [(s.load, s.slo_met) for s in r.steps]   # a busy machine serves slower, never faster
    assert 2.3 < r.capacity or "client_saturated" in r.flags, [(s.load, s.slo_met) for s in r.steps]
    replayed = [s for s in r.steps[1:]]
    assert all(s.measurement.load["time_scale"] == pytest.approx(1 / s.load) for s in replayed)
    assert all(s.measurement.load["num_requests"] == 38 for s in replayed)    # the trace once, after 2 warm-up
    assert any(not s.slo_met for s in r.steps)


async def test_bench_command_prints_the_profile_and_the_drift(tmp_path: Path) -> None:
    trace, out = bursty_trace(tmp_path / "t.jsonl", bursts=3), tmp_path / "out.json"
    async with serve(build_app(MockConfig(mode="stream", itl_ms=1))) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "autotune", "bench", "--url", url, "--model", "mock", "--workload",
            f"trace:path={trace}", "--json", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    text = stdout.decode()
    assert proc.returncode == 0, stderr.decode()
    assert "workload: 24 requests" in text and "inter-arrival CV" in text and "P99 send drift (ms):" in text
    doc = json.loads(out.read_text())
    assert doc["completed"] == 24 and doc["median_send_gap_ms"] == pytest.approx(50.0, abs=0.5)
    assert doc["p99_send_drift_ms"] < DRIFT_BOUND_GAPS * doc["median_send_gap_ms"] or doc["client"]["saturated"]
    assert doc["workload_profile"]["requests"] == 24
    assert doc["workload_profile"]["arrivals"]["mean_rate"] == pytest.approx(23 / (2 * 0.6 + 7 * 0.05))
    assert all(r["scheduled_s"] is not None for r in doc["requests"])


@pytest.mark.parametrize("fmt", ["openai", "sharegpt", "csv"])
async def test_each_converted_format_replays(tmp_path: Path, fmt: str) -> None:
    from autotune.bench.trace.command import main as convert
    from autotune.bench.trace.format import read_trace

    if fmt == "openai":
        src = tmp_path / "log.jsonl"
        src.write_text("".join(json.dumps({"timestamp": 100 + 0.05 * i, "request": {"messages": [
            {"role": "user", "content": f"q {i}"}]}, "response": {"usage": {"prompt_tokens": 3,
            "completion_tokens": 2 + i % 5}}}) + "\n" for i in range(12)))
    elif fmt == "sharegpt":
        src = tmp_path / "sg.jsonl"
        src.write_text("".join(json.dumps({"conversations": [{"from": "human", "value": "a b c"},
            {"from": "gpt", "value": "x " * (i + 2)}, {"from": "human", "value": "d e"},
            {"from": "gpt", "value": "y"}]}) + "\n" for i in range(6)))
    else:
        src = tmp_path / "log.csv"
        src.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{0.04 * i},{5 + i},{1 + i % 4}\n"
                                                                         for i in range(12)))
    out = tmp_path / "trace.jsonl"
    extra = ["--rate", "20", "--think", "0.02"] if fmt == "sharegpt" else []
    assert convert([str(src), "-o", str(out), *extra]) == 0
    _, recs = read_trace(out)
    async with serve(build_app(MockConfig(mode="stream", itl_ms=1))) as url:
        m = await run_load(url, "mock", parse_workload(f"trace:path={out}"), endpoint="chat")
    assert m.metrics["completed"] == len(recs) == 12 and m.metrics["failed"] == 0
    # each request asked for its recorded completion length, which the mock honours exactly
    assert m.metrics["total_output_tokens"] == sum(r.output_tokens for r in recs)
    assert "p99_send_drift_ms" in m.metrics


async def test_a_trace_that_holds_even_as_one_burst_reports_capacity_as_a_lower_bound(tmp_path: Path) -> None:
    # 10 requests over 0.9 s against a server that streams every request on its own (no queue): no
    # speed-up breaks the SLO; past the speed-up where the step is one burst the search stops and says so
    w = parse_workload(f"trace:path={bursty_trace(tmp_path / 't.jsonl', bursts=1, per_burst=10, gap_s=0.1)}")
    async with serve(build_app(MockConfig(mode="stream", itl_ms=2))) as url:
        r = await find_capacity(url, "mock", w, SLO.parse("ttft:p99<=5s"), search="time_scale", max_steps=8,
                                requests_per_step=200, warmup=0)
    probe_e2el = r.steps[0].measurement.metrics["median_e2el_ms"] / 1000
    cap = float(f"{4 * 0.9 / probe_e2el:.3g}")                       # 10 requests within a quarter of one
    assert r.capacity == cap and len(r.steps) < 8, [s.load for s in r.steps]
    assert "capacity is at least that" in r.note
