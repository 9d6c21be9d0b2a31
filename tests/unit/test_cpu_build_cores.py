"""On vLLM's CPU build the server's OpenMP threads spin on every core they get: a load client sharing those
cores is starved and flags itself `client_saturated`. A CPU-build lease of two cores or more therefore
binds the server's compute threads to all but the last core (VLLM_CPU_OMP_THREADS_BIND) and pins the
load client (its measurement worker process) to the last one; the server starts on the whole lease and
moves onto the compute cores, every thread of it, once ready. A GPU lease keeps one shared set."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest

import autotune.tuner.trial as trial_module
from autotune.node.pool import Lease
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.spec import build_spec
from autotune.store.repository import ResultStore
from autotune.telemetry import get_source
from autotune.tuner.trial import TrialRunner, cpu_build_split


def test_split_keeps_the_last_core_for_the_client() -> None:
    assert cpu_build_split((0, 1)) == ((0,), (1,))
    assert cpu_build_split((4, 5, 6, 7)) == ((4, 5, 6), (7,))
    assert cpu_build_split((3,)) == ((3,), (3,))          # one core: nothing to split
    assert cpu_build_split(()) == ((), ())


class _NeverReady(Server):
    def __init__(self, request: LaunchRequest) -> None:
        self.pid, self.url, self.log_path = 999_999, f"http://127.0.0.1:{request.port}", request.log_path

    def wait_ready(self) -> StartupInfo:
        raise EngineFailure("crash", "stand-in server: exits at once")

    def alive(self) -> bool:
        return False

    def failure(self) -> EngineFailure | None:
        return None

    def stop(self, grace_s: float = 15.0) -> None:
        pass

    def log_tail(self, lines: int = 40) -> str:
        return ""


class _Recorder(Engine):
    name = "vllm"

    def __init__(self) -> None:
        self.requests: list[LaunchRequest] = []

    def launch(self, request: LaunchRequest) -> Server:
        self.requests.append(request)
        return _NeverReady(request)

    def unknown_flags(self, flags: Sequence[str]) -> list[str]:
        return []

    def version(self) -> str | None:
        return None

    def release_wait(self, port: int, gpus: Sequence[int], timeout_s: float = 60.0) -> None:
        pass


@pytest.mark.parametrize("gpus, server, client, bind", [
    ((), (0, 1), (1,), "0"),            # the CPU build: compute threads on core 0, the client on core 1
    ((0,), (0, 1), (0, 1), None),       # a GPU lease: server and client share its cores
])
def test_the_runner_launches_and_pins_by_that_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus, server,
                                                    client, bind) -> None:
    if not set(server) | set(client) <= set(trial_module._affinity()):
        pytest.skip("needs cores 0 and 1 in this process's affinity")
    spec = build_spec({"name": "cores", "model": str(tmp_path), "engine": {"kind": "vllm", "command": ["vllm"]},
                       "storage": f"sqlite:///{tmp_path}/c.db", "telemetry": {"source": "cpu"}}, "test")
    engine = _Recorder()
    pinned: list[tuple[int, ...]] = []       # the cores each measurement worker (the load client) was given

    class Recorded(trial_module.Worker):
        def start(self) -> trial_module.Worker:
            pinned.append(self.cores)
            return super().start()
    monkeypatch.setattr(trial_module, "Worker", Recorded)
    runner = TrialRunner(spec, engine, get_source("cpu"), ResultStore(spec.storage_url), tmp_path, [], None)
    lease = Lease(host="h", gpus=tuple(gpus), slots=(0,), cores=(0, 1), port_base=trial_module.find_free_port())
    outcome = runner.run(0, [], [], lambda text: None, lease=lease)
    assert outcome.state == "failed" and outcome.cause == "crash"
    [request] = engine.requests
    assert tuple(request.cores) == server
    assert request.env.get("VLLM_CPU_OMP_THREADS_BIND") == bind
    # the one-process executor binds nothing: as many OpenMP threads as compute cores
    assert request.env.get("OMP_NUM_THREADS") == (None if bind is None else "1")
    assert pinned[0] == client


def test_confine_moves_every_thread_of_a_server_and_of_its_children(tmp_path: Path) -> None:
    import os
    import signal
    import sys

    from autotune.engine.process import confine, spawn, stop_group

    if not {0, 1} <= set(trial_module._affinity()):
        pytest.skip("needs cores 0 and 1 in this process's affinity")
    # a parent with two threads and a child with two threads, all started on both cores
    body = ("import threading, subprocess, sys, time\n"
            "for _ in range(2): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
            "if sys.argv[1] == 'parent':\n"
            "    subprocess.Popen([sys.executable, '-c', open(__file__).read(), 'child'])\n"
            "print('up', flush=True)\n"
            "time.sleep(600)\n")
    script = tmp_path / "tree.py"
    script.write_text(body)
    log = tmp_path / "tree.log"
    proc = spawn([sys.executable, str(script), "parent"], log, cores=(0, 1))
    try:
        import psutil
        parent = psutil.Process(proc.pid)
        import time

        def up() -> bool:     # both processes said so, with their threads started
            kids = parent.children()
            return log.read_text().count("up") >= 2 and len(kids) == 1 and kids[0].num_threads() >= 3
        for _ in range(6000):                                   # waits for the event; 60 s at most
            if up():
                break
            time.sleep(0.01)
        assert up()
        procs = [parent, *parent.children(recursive=True)]
        assert len(procs) == 2
        moved = confine(proc.pid, (0,))
        tids = [t.id for p in procs for t in p.threads()]
        assert moved == len(tids) >= 6
        assert all(os.sched_getaffinity(tid) == {0} for tid in tids)
    finally:
        stop_group(proc.pid, os.getpgid(proc.pid), grace_s=5, popen=proc)
    assert proc.poll() is not None and proc.returncode == -signal.SIGTERM
