"""The vllm engine against the real vLLM CPU build: starts, failures by cause, and nothing left behind.

Measured on the 2-core reference box (noisy, shared): a light start is ready in about 45-60 s; a bad flag
fails in about 10 s. GMU 0.99 (startup_oom, read from the log without waiting for the timeout) is
tests/e2e/test_tuning_loop.py's failing candidate.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from autotune import causes
from autotune.engine import EngineFailure, LaunchRequest, VLLMEngine, find_free_port
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (CPU build) is not installed")]


def group_alive(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


@pytest.fixture(scope="module")
def engine(tmp_path_factory, vllm_command) -> VLLMEngine:
    return VLLMEngine(vllm_command, cache_dir=tmp_path_factory.mktemp("help"))


def launch(engine: VLLMEngine, model: Path, flags: list[str], log_path: Path, timeout: float = 300):
    return engine.launch(LaunchRequest(model=str(model), flags=flags, port=find_free_port(), log_path=log_path,
                                       startup_timeout_s=timeout))


@pytest.mark.vllm
def test_shared_server_reports_startup_figures_and_serves(vllm_server):
    info = vllm_server.startup
    assert info.kv_cache_tokens and info.kv_cache_tokens > 1024  # at least one max-len request fits
    assert info.max_concurrency and info.max_concurrency > 1
    assert info.init_engine_seconds and 0 < info.init_engine_seconds < info.startup_seconds
    assert info.engine_version == "0.32.0"
    models = httpx.get(vllm_server.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [vllm_server.model]
    done = httpx.post(vllm_server.url + "/v1/completions", timeout=60, json={
        "model": vllm_server.model, "prompt": "The tuner starts", "max_tokens": 8, "ignore_eos": True})
    assert done.json()["usage"]["completion_tokens"] == 8
    # VLLM_SERVER_DEV_MODE=1 is set by the engine, so the prefix-cache reset endpoint exists
    assert httpx.post(vllm_server.url + "/reset_prefix_cache", timeout=10).status_code == 200


def test_stop_takes_engine_core_and_workers_and_death_after_ready_is_classified(engine, demo_model_dir, light_flags, tmp_path):
    server = launch(engine, demo_model_dir, light_flags, tmp_path / "ok.log")
    try:
        server.wait_ready()
        assert engine.version() == "0.32.0"  # this entry point has no --version: read from the launch banner
        # its engine's ZMQ sockets are in a folder of its own (vLLM leaves them in /tmp otherwise)
        assert server.rpc_dir is not None and any(p.is_socket() for p in server.rpc_dir.iterdir())
        names = {psutil.Process(pid).name() for pid in group_alive(server.pgid)}
        assert "VLLM::EngineCore" in names  # the children exist, in the group
        assert server.failure() is None and server.alive()
        core = next(p for p in psutil.Process(server.pid).children(recursive=True) if p.name() == "VLLM::EngineCore")
        core.send_signal(signal.SIGKILL)  # a death after readiness, as the OOM killer would do it
        deadline = time.monotonic() + 60
        while server.failure() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        failure = server.failure()
        assert failure is not None, "API server kept running after its EngineCore died"
        assert failure.cause in (causes.CRASH, causes.RUNTIME_OOM), failure
        print(f"EngineCore SIGKILLed after ready -> {failure.cause}: {failure.detail} (exit {failure.exit_code})")
        assert group_alive(server.pgid) == []
    finally:
        server.stop(grace_s=5)
    assert group_alive(server.pgid) == []
    assert not server.rpc_dir.exists()
    server.stop()  # idempotent


def test_bad_flag_is_bad_flag_within_seconds_and_is_caught_before_launch_too(engine, demo_model_dir, light_flags, tmp_path):
    assert engine.unknown_flags(["--max-num-seqs", "4", "--max-num-seqz", "8", "--no-enable-prefix-caching",
                                 "--enforce_eager", "--compilation-config.mode=0"]) == ["--max-num-seqz"]
    server = launch(engine, demo_model_dir, light_flags + ["--max-num-seqz", "8"], tmp_path / "bad.log", timeout=600)
    started = time.monotonic()
    with pytest.raises(EngineFailure) as caught:
        server.wait_ready()
    took = time.monotonic() - started
    print(f"bad flag -> {caught.value.cause} after {took:.1f} s")
    assert took < 150  # at argparse, far below the 600 s timeout
    assert caught.value.cause == causes.BAD_FLAG
    assert "unrecognized arguments: --max-num-seqz" in caught.value.detail
    assert caught.value.exit_code == 2
    assert group_alive(server.pgid) == []
