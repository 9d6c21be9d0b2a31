"""A PD deployment (engine/deployment.py) on the simulator: real processes, real HTTP through autotune's
router, the twin playing NixlConnector on both sides. It starts, serves, stops with every process gone;
one process's death fails it with that process named; a SIGKILLed tuner leaves none of it behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from autotune.engine.base import LaunchRequest
from autotune.engine.deployment import Deployment, launch
from autotune.engine.process import find_free_port, port_free
from autotune.engine.sim import SimEngine

FLAGS = ["--max-model-len", "4096", "--max-num-seqs", "32", "--pd-prefill", "1", "--pd-decode", "1"]


def _start(tmp_path: Path, flags: list[str] = FLAGS, time_scale: float = 40) -> Deployment:
    engine = SimEngine("H100", 2, time_scale=time_scale)
    server = launch(engine, LaunchRequest(model="llama-3.1-8b", flags=flags, port=find_free_port(),
                                          log_path=tmp_path / "trial-0001.log", startup_timeout_s=60))
    assert isinstance(server, Deployment)
    return server


def _gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """The PIDs still running after waiting up to `timeout` for them to end (an event, not a sleep)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in {url}/metrics")


def test_serves_through_the_router_with_the_kv_handed_over_and_stops_every_process(tmp_path: Path) -> None:
    server = _start(tmp_path)
    try:
        info = server.wait_ready()
        assert info.simulated and info.kv_cache_tokens
        names = [m.name for m in server.members]
        assert [m.role for m in server.members] == ["prefill", "decode", "router"]
        assert names[0].startswith("prefill instance 0 (port ") and names[2] == f"router (port {server.router.port})"
        body = {"model": "llama-3.1-8b", "prompt": "word " * 1000, "max_tokens": 8, "stream": True,
                "stream_options": {"include_usage": True}}
        times: list[float] = []
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as resp:
            assert resp.status_code == 200
            assert resp.headers["x-autotune-simulated"] == "true"
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    times += json.loads(line[6:]).get("autotune_sim", {}).get("token_times_s", [])
        assert len(times) == 8
        prefill, decode = (f"http://127.0.0.1:{m.port}" for m in server.instances)
        # the prefill instance computed the prompt and one token; the decode instance only the prompt's
        # last token, then the eight tokens of the answer: the KV was handed over
        assert _metric(prefill, "vllm:prompt_tokens_total") == 1000
        assert _metric(prefill, "vllm:generation_tokens_total") == 1
        assert _metric(decode, "vllm:prompt_tokens_total") == 1
        assert _metric(decode, "vllm:generation_tokens_total") == 8
        # the client's first token counts the prefill elsewhere and the transfer: later than the decode step
        assert times[0] > times[1] - times[0]
        telemetry = httpx.get(server.url + "/sim/telemetry", timeout=5).json()
        assert [g["index"] for g in telemetry["gpus"]] == [0, 1]
        assert httpx.post(server.url + "/reset_prefix_cache", timeout=5).status_code == 200
    finally:
        pids = [m.server.pid for m in server.members]
        server.stop(grace_s=10)
    assert not _gone(pids)
    assert all(port_free(m.port) for m in server.members)
    logs = sorted(p.name for p in tmp_path.glob("*.log"))
    assert logs == ["trial-0001.decode-0.log", "trial-0001.log", "trial-0001.prefill-0.log"]
    assert "Starting router on" in (tmp_path / "trial-0001.log").read_text()


@pytest.mark.parametrize("victim", ["router"])   # a decode instance: test_pd_study_sim.py, under load
def test_a_dead_process_fails_the_deployment_with_its_name(tmp_path: Path, victim: str) -> None:
    server = _start(tmp_path)
    try:
        server.wait_ready()
        target = next(m for m in server.members if m.role == victim)
        os.kill(target.server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (failure := server.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.1)   # polls for the event (the PID's exit), bounded only against a hang
        assert failure is not None
        assert failure.detail.startswith(f"{target.name} exited: "), failure.detail
        assert target.name in failure.log_tail
        assert not _gone([m.server.pid for m in server.members])   # the others were stopped with it
    finally:
        server.stop(grace_s=5)


def test_a_decode_instance_dying_mid_answer_cuts_the_clients_stream(tmp_path: Path) -> None:
    """The router cannot send an error once the answer has begun: it cuts the client's connection, so a
    load client (aiohttp, as bench's) fails the request at once instead of waiting out its stall timeout."""
    import asyncio

    import aiohttp

    server = _start(tmp_path, time_scale=1)    # 2,000 tokens take the twin seconds of wall time

    async def request() -> str:
        body = {"model": "llama-3.1-8b", "prompt": "word " * 100, "max_tokens": 2000, "stream": True}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            async with session.post(server.url + "/v1/completions", json=body) as resp:
                await resp.content.readline()              # the answer has begun (an event, not a sleep)
                os.kill(server.instances[1].server.pid, signal.SIGKILL)
                try:
                    async for _ in resp.content.iter_any():
                        pass
                except aiohttp.ClientPayloadError:
                    return "cut"
                return "ended"

    try:
        server.wait_ready()
        assert asyncio.run(request()) == "cut"
        assert "failed mid-answer" in (tmp_path / "trial-0001.log").read_text()
    finally:
        server.stop(grace_s=5)


def test_a_startup_failure_names_the_instance(tmp_path: Path) -> None:
    """A decode instance that cannot start (its memory does not fit) fails the whole start, named."""
    server = _start(tmp_path, [*FLAGS, "--gpu-memory-utilization", "0.1"])
    with pytest.raises(Exception) as got:
        server.wait_ready()
    assert "instance 0 (port" in str(got.value) and " exited: " in str(got.value)
    assert not _gone([m.server.pid for m in server.members])


_TUNER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from autotune.engine.base import LaunchRequest
    from autotune.engine.deployment import launch
    from autotune.engine.process import find_free_port
    from autotune.engine.sim import SimEngine
    server = launch(SimEngine("H100", 3, time_scale=40), LaunchRequest(
        model="llama-3.1-8b", flags=["--max-model-len", "4096", "--pd-prefill", "1", "--pd-decode", "2"],
        port=find_free_port(), log_path=Path(sys.argv[1]) / "trial-0001.log", startup_timeout_s=60))
    server.wait_ready()
    print(json.dumps([m.server.pid for m in server.members]), flush=True)
    sys.stdin.read()   # until killed
""")


def test_sigkill_of_the_tuner_leaves_no_deployment_process(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TUNER, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 4 and all(psutil.pid_exists(p) for p in pids)   # 1 prefill, 2 decode, the router
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert not _gone(pids), "outlived the tuner"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
