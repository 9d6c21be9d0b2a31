"""VLLMEngine's own logic, driven by a small real program that behaves like vLLM's command line.

The fake engine is a real subprocess on loopback (readiness, early death, hang, help text); the real
vLLM CPU build is exercised in tests/e2e/test_engine_vllm.py.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune import causes
from autotune.engine import EngineFailure, LaunchRequest, VLLMEngine, find_free_port
from autotune.errors import UserError

FAKE = textwrap.dedent('''
    import http.server, json, os, sys, time
    args = sys.argv[1:]
    mode = os.environ.get("FAKE_MODE", "serve")
    if "--help=all" in args or "--help" in args:
        if mode == "no-help-all" and "--help=all" in args:
            print("error: unknown help section", file=sys.stderr); sys.exit(2)
        with open(os.environ["FAKE_COUNT"], "a") as f:
            f.write("help\\n")
        opts = ["--model", "--host", "--port", "--max-num-seqs", "--max-num-batched-tokens", "--dtype",
                "--enable-prefix-caching | --no-enable-prefix-caching", "--enforce-eager",
                "--gpu-memory-utilization", "--compilation-config", "--max-model-len"]
        print("usage: fake [-h] " + " ".join("[" + o + "]" for o in opts))
        sys.exit(0)
    if "--version" in args:
        print("7.8.9"); sys.exit(0)
    print("ARGV " + json.dumps(args), flush=True)
    print("ENV " + json.dumps({k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "CUDA_VISIBLE_DEVICES", "EXTRA", "VLLM_RPC_BASE_PATH")}), flush=True)
    print("INFO 11-29 [api_utils.py:1]  version 0.99.1", flush=True)
    if mode == "die":
        time.sleep(0.3)
        print("(EngineCore pid=1) ERROR [core.py:1] ValueError: Free memory on device cuda:0 (1.0/80.0 GiB) on startup "
              "is less than desired GPU memory utilization (0.9, 72.0 GiB).", flush=True)
        sys.exit(1)
    if mode == "hang":
        time.sleep(120)
    port = int(args[args.index("--port") + 1])
    time.sleep(0.5)
    print("CPU KV cache size: 12,345 tokens", flush=True)
    print("Maximum concurrency for 1,024 tokens per request: 12.06x", flush=True)
    print("init engine (profile, create kv cache, warmup model) took 0.40 s", flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a):
            pass
    print("INFO:     Application startup complete.", flush=True)
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    if mode == "oom-later":
        import threading
        def die():
            time.sleep(1.0)
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB", flush=True)
            os._exit(1)
        threading.Thread(target=die, daemon=True).start()
    srv.serve_forever()
''')


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE)
    monkeypatch.setenv("FAKE_COUNT", str(tmp_path / "count"))
    return VLLMEngine([sys.executable, str(script)], cache_dir=tmp_path / "cache")


def request(tmp_path, flags=(), **kw):
    return LaunchRequest(model="models/demo", flags=list(flags), port=find_free_port(), log_path=tmp_path / "t.log",
                         **kw)


def logged(path: Path, tag: str):
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith(tag + " "))
    return json.loads(line[len(tag) + 1:])


def test_argv_appends_model_host_port_then_flags():
    eng = VLLMEngine(["vllm", "serve"])
    assert eng.argv("m", 8000, (), ["--max-num-seqs", "8"]) == [
        "vllm", "serve", "--model", "m", "--host", "127.0.0.1", "--port", "8000", "--max-num-seqs", "8"]


def test_argv_fills_placeholders_for_a_container():
    eng = VLLMEngine(["docker", "run", "--gpus", '"device={gpus}"', "-p", "127.0.0.1:{port}:8000", "img",
                      "--model", "/models/{model}"])
    assert eng.argv("llama", 9001, (2, 3), ["--enforce-eager"]) == [
        "docker", "run", "--gpus", '"device=2,3"', "-p", "127.0.0.1:9001:8000", "img", "--model", "/models/llama",
        "--enforce-eager"]


def test_launch_ready_env_and_startup_figures(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "serve")
    req = request(tmp_path, ["--max-num-seqs", "8"], gpus=(1,), env={"EXTRA": "yes"})
    started = time.monotonic()
    server = fake.launch(req)
    try:
        info = server.wait_ready()
        took = time.monotonic() - started
        assert (info.kv_cache_tokens, info.max_concurrency, info.init_engine_seconds) == (12345, 12.06, 0.4)
        # from the launch to ready: the fake's 0.5 s at least, and no more than the test saw pass
        assert info.engine_version == "0.99.1" and 0.5 <= info.startup_seconds <= took + 0.001
        assert logged(req.log_path, "ARGV")[-2:] == ["--max-num-seqs", "8"]
        assert logged(req.log_path, "ENV") == {"VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "1", "EXTRA": "yes",
                                               "VLLM_RPC_BASE_PATH": str(server.rpc_dir)}
        assert server.rpc_dir.is_dir()     # its IPC sockets' own folder, removed when it stops
        assert server.url == f"http://127.0.0.1:{req.port}" and server.pgid == server.pid and server.create_time > 0
        assert server.alive() and server.failure() is None
    finally:
        server.stop(grace_s=2)
    assert not server.alive() and server.failure() is None  # stopped by us: not a failure
    assert not server.rpc_dir.exists()
    server.stop()


def test_the_ipc_folder_is_the_users_where_they_set_it_and_absent_where_a_socket_would_not_fit(
        fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "serve")
    req = request(tmp_path, env={"VLLM_RPC_BASE_PATH": str(tmp_path)})
    server = fake.launch(req)
    try:
        server.wait_ready()
        assert server.rpc_dir is None and logged(req.log_path, "ENV")["VLLM_RPC_BASE_PATH"] == str(tmp_path)
    finally:
        server.stop(grace_s=2)
    assert tmp_path.is_dir()                 # not ours to remove
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr("tempfile.tempdir", None)     # tempfile reads TMPDIR again
    second = tmp_path / "second"
    second.mkdir()
    req = request(second)
    server = fake.launch(req)
    try:
        server.wait_ready()
        assert server.rpc_dir is None and logged(req.log_path, "ENV")["VLLM_RPC_BASE_PATH"] is None
    finally:
        server.stop(grace_s=2)
    assert list(deep.iterdir()) == []        # the folder that would not fit was removed at once


def test_a_launch_removes_the_ipc_folders_of_autotune_processes_that_are_gone(fake, tmp_path, monkeypatch):
    import os
    import subprocess

    import psutil

    monkeypatch.setenv("FAKE_MODE", "serve")
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr("tempfile.tempdir", None)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_start = round(psutil.Process(gone.pid).create_time() * 100)
    gone.wait()
    me = psutil.Process(os.getpid())
    dead = base / f"autotune-rpc-{gone.pid}-{gone_start}-abc123"          # its owner was SIGKILLed
    reused = base / f"autotune-rpc-{os.getpid()}-{round(me.create_time() * 100) - 10000}-abc123"  # PID reused since
    live = base / f"autotune-rpc-{os.getpid()}-{round(me.create_time() * 100)}-abc123"            # a running server's
    other = base / "autotune-rpc-notours"
    for folder in (dead, reused, live, other):
        folder.mkdir()
        (folder / "sock").write_text("")
    server = fake.launch(request(tmp_path))
    try:
        server.wait_ready()
    finally:
        server.stop(grace_s=2)
    assert not dead.exists() and not reused.exists()
    assert live.exists() and other.exists()


def test_early_exit_is_reported_at_once_with_its_cause(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "die")
    server = fake.launch(request(tmp_path, startup_timeout_s=60))
    started = time.monotonic()
    with pytest.raises(EngineFailure) as caught:
        server.wait_ready()
    assert time.monotonic() - started < 30                 # at once: not at the 60 s startup timeout
    assert caught.value.cause == causes.STARTUP_OOM and caught.value.exit_code == 1
    assert caught.value.detail.startswith("Free memory on device cuda:0 (1.0/80.0 GiB)")
    assert "ValueError" in caught.value.log_tail


def test_hang_becomes_startup_timeout_and_the_group_is_stopped(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "hang")
    server = fake.launch(request(tmp_path, startup_timeout_s=1.0))
    with pytest.raises(EngineFailure) as caught:
        server.wait_ready()
    assert caught.value.cause == causes.STARTUP_TIMEOUT
    assert not server.alive()


def test_death_after_ready_is_classified_from_the_log(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "oom-later")
    server = fake.launch(request(tmp_path))
    server.wait_ready()
    deadline = time.monotonic() + 60
    while server.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    failure = server.failure()
    assert failure is not None and failure.cause == causes.RUNTIME_OOM
    assert "CUDA out of memory" in failure.detail
    assert server.failure() is failure  # stable
    server.stop()


def test_log_of_an_earlier_launch_in_the_same_file_is_not_read(fake, tmp_path, monkeypatch):
    req = request(tmp_path)
    req.log_path.write_text("api_server.py: error: unrecognized arguments: --old\n")
    monkeypatch.setenv("FAKE_MODE", "die")
    with pytest.raises(EngineFailure) as caught:
        fake.launch(req).wait_ready()
    assert caught.value.cause == causes.STARTUP_OOM


def test_unknown_flags_from_help_cached_on_disk(fake, tmp_path):
    flags = ["--max-num-seqs", "8", "--max_num_batched_tokens=64", "--no-enable-prefix-caching",
             "--compilation-config.mode", "0", "--max-num-seqz", "--bogus=1", "-tp", "2", "--bogus"]
    assert fake.unknown_flags(flags) == ["--max-num-seqz", "--bogus"]
    again = VLLMEngine(fake.command, cache_dir=fake.cache_dir)  # a new study, same command
    assert again.unknown_flags(["--enforce-eager", "--nope"]) == ["--nope"]
    assert (tmp_path / "count").read_text().count("help") == 1  # the help ran once in all


def test_help_falls_back_to_plain_help(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "no-help-all")
    assert fake.unknown_flags(["--dtype", "--x"]) == ["--x"]


def test_version_from_the_command_once(fake, tmp_path):
    assert fake.version() == "7.8.9"
    assert VLLMEngine(fake.command, cache_dir=fake.cache_dir).version() == "7.8.9"


def test_missing_command_is_a_user_error(tmp_path):
    eng = VLLMEngine([str(tmp_path / "no-such-vllm"), "serve"], cache_dir=tmp_path)
    with pytest.raises(UserError, match="engine command not found"):
        eng.unknown_flags(["--x"])
    with pytest.raises(UserError, match="engine command not found"):
        eng.launch(request(tmp_path))
    with pytest.raises(UserError, match="empty"):
        VLLMEngine([])


def test_a_command_that_prints_no_help_is_a_user_error(tmp_path):
    eng = VLLMEngine([sys.executable, "-c", "import sys; print('boom: no such module'); sys.exit(1)"],
                     cache_dir=tmp_path)
    with pytest.raises(UserError, match="failed to print its help"):
        eng.unknown_flags(["--x"])


def test_release_wait_without_gpus_waits_for_the_port_only(fake):
    started = time.monotonic()
    fake.release_wait(find_free_port(), gpus=(), timeout_s=60)
    assert time.monotonic() - started < 10                 # at once: not at the 60 s timeout


def test_version_from_a_launch_banner_when_the_command_has_no_version_flag(tmp_path, monkeypatch):
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE.replace('if "--version" in args:', 'if False:'))  # --version now fails
    monkeypatch.setenv("FAKE_COUNT", str(tmp_path / "count"))
    eng = VLLMEngine([sys.executable, str(script)], cache_dir=tmp_path / "cache")
    monkeypatch.setenv("FAKE_MODE", "die")  # prints the banner, then fails
    with pytest.raises(EngineFailure):
        eng.launch(request(tmp_path)).wait_ready()
    # a later launch that died in argparse, before any banner
    later = eng.launch(LaunchRequest(model="m", flags=[], port=find_free_port(), log_path=tmp_path / "argparse.log"))
    later.popen.wait()
    (tmp_path / "argparse.log").write_text("fake: error: unrecognized arguments: --x\n")
    assert eng.version() == "0.99.1"
