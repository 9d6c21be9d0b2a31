"""Shared fixtures: the demo model, and one real vLLM CPU-build server per test session.

Starting vLLM costs about 50 s on the 2-core machine, so every test marked `vllm` shares one server.
Tests that need their own server (different flags, or a server they may kill) launch it themselves.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from autotune.demo_model import write_demo_model
from autotune.engine import EngineFailure, LaunchRequest, StartupInfo, VLLMEngine, VLLMServer, find_free_port

REPO = Path(__file__).resolve().parents[1]
LIGHT_FLAGS = ["--dtype", "bfloat16", "--max-model-len", "1024", "--gpu-memory-utilization", "0.15",
               "--max-num-seqs", "16", "--enforce-eager"]
# The shared VLM server: room for two images of the demo VLM (at most 335 tokens each) and text; at most
# 2 images a prompt and no processor cache, so that the multimodal knobs are exercised on the real engine.
VLM_FLAGS = ["--dtype", "bfloat16", "--max-model-len", "2048", "--gpu-memory-utilization", "0.15",
             "--max-num-seqs", "8", "--enforce-eager", "--limit-mm-per-prompt", '{"image": 2}',
             "--mm-processor-cache-gb", "0"]


# What a test needs, read off the fixtures it asks for, so that a marker cannot be forgotten: `make
# test-fast` deselects these (tests under tests/e2e/ are `e2e` by their folder). `study`: a whole study
# in its own processes (a run or a daemon, a server per trial), tens of seconds to minutes each.
_NEEDS = {"vllm_server": "vllm", "vlm_server": "vllm", "postgres_server": "postgres", "postgres_url": "postgres",
          "autotune_run": "study", "sim_spec": "study"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in _NEEDS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        if "tests/e2e/" in item.nodeid or item.nodeid.startswith("e2e/"):
            item.add_marker("e2e")


# With this the CPU build keeps vLLM's one-process executor (it forces the multiprocess one otherwise): the
# worker runs inside the engine core, so a start imports torch and vLLM in two processes, not three (API
# server, engine core, worker), ~27 CPU seconds instead of ~40 here. Every study of the suite runs so (the
# API server still has its engine core as a child: a tree to stop, a child to wait for). The shared servers
# keep vLLM's three processes: with one, a busy box once got all 16 tokens of a request in one chunk
# (TTFT = E2EL, test_bench_vllm), and test_engine_vllm's subject is stopping the workers.
ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_cmd() -> list[str]:
    """How the CPU build is started here (its `vllm` console script is broken)."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None  # finds it without importing it


@dataclass
class VLLMHandle:
    url: str            # base URL, e.g. http://127.0.0.1:41573
    model: str          # the name the server serves (the model path it was given)
    server: VLLMServer
    startup: StartupInfo


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="session")
def vllm_command() -> list[str]:
    """vllm_cmd() as a fixture, so test modules need not import conftest."""
    return vllm_cmd()


@pytest.fixture(scope="session")
def one_process_env() -> dict[str, str]:
    """ONE_PROCESS as a fixture, for a study spec's `engine.env`."""
    return dict(ONE_PROCESS)


@pytest.fixture(scope="session")
def light_flags() -> list[str]:
    """Flags that keep the CPU build light (the shared server uses exactly these)."""
    return list(LIGHT_FLAGS)


def _made_once(make: Any) -> Path:
    """`make()` under a lock on models/: `make test` runs several pytest sessions at once
    (tests/streams.py), and two of them writing one model would let a third read it half written."""
    import fcntl

    (REPO / "models").mkdir(exist_ok=True)
    with open(REPO / "models" / ".write.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return make()


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    return _made_once(lambda: write_demo_model(REPO / "models" / "demo"))


def _shared_server(model: Path, flags: list[str], factory: pytest.TempPathFactory, what: str,
                   startup_timeout_s: float = 300) -> Iterator[VLLMHandle]:
    """Start one vLLM CPU-build server for the session, yield it, stop it and check its processes are gone."""
    if not vllm_installed():
        pytest.skip("vLLM (CPU build) is not installed in this environment")
    engine = VLLMEngine(vllm_cmd(), cache_dir=factory.mktemp(f"{what}-help-cache"))
    log_path = factory.mktemp(f"{what}-server") / "server.log"
    server = engine.launch(LaunchRequest(model=str(model), flags=flags, port=find_free_port(),
                                         log_path=log_path, startup_timeout_s=startup_timeout_s))
    try:
        startup = server.wait_ready()
    except EngineFailure as exc:
        pytest.fail(f"shared {what} server did not start: {exc}\n{exc.log_tail}")
    family = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
    try:
        yield VLLMHandle(url=server.url, model=str(model), server=server, startup=startup)
    finally:
        server.stop()
    left = [pid for pid in family if _running(pid)]
    assert not left, f"shared {what} server left processes behind: {left}"


@pytest.fixture(scope="session")
def vllm_server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMHandle]:
    yield from _shared_server(demo_model_dir, LIGHT_FLAGS, tmp_path_factory, "vllm")


@pytest.fixture(scope="session")
def demo_vlm_dir() -> Path:
    """The tiny random-weight VLM (Idefics3 architecture) the CPU build serves; needs torch and transformers."""
    pytest.importorskip("transformers")
    from autotune.demo_vlm import write_demo_vlm

    return _made_once(lambda: write_demo_vlm(REPO / "models" / "demo-vlm", "idefics3"))


@pytest.fixture(scope="session")
def vlm_server(demo_vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMHandle]:
    """One vLLM CPU-build server of the demo VLM for the session's bench-level image tests."""
    yield from _shared_server(demo_vlm_dir, VLM_FLAGS, tmp_path_factory, "vlm", startup_timeout_s=400)


class AutotuneRun:
    """`python -m autotune ARGS` in its own session with its output collected line by line, so a test
    can wait for a moment in a study (a trial starting, a load step) and then signal it."""

    def __init__(self, args: list[str], cwd: Path):
        import os
        import subprocess
        import threading

        self.proc = subprocess.Popen([sys.executable, "-m", "autotune", *args], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float) -> None:
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            if predicate(self.lines):
                return
            time.sleep(0.2)
        raise AssertionError("condition not met; output:\n" + "\n".join(self.lines[-40:]))

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code


def _servers_in(cwd: Path, marker: str) -> list:
    """Server processes (command line containing `marker`) started from `cwd`: servers inherit the
    working directory of the run that launched them, which tells them from others on the machine."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and Path(p.cwd()) == cwd:
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.fixture()
def autotune_cli() -> Any:
    """`autotune_cli(*args, cwd=PATH)` runs one `autotune` command to its end in a process of its own, with
    this checkout's autotune first on the path (whatever the venv has installed)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True,
                              timeout=600, cwd=cwd, env=env)

    return run


@pytest.fixture()
def autotune_run() -> Iterator[Any]:
    """`autotune_run(args, cwd)` starts one run. A run the test left running (it failed before stopping
    it) is killed with its process group at teardown: a failed test leaves no daemon behind."""
    import os
    import signal

    runs: list[AutotuneRun] = []

    def start(args: list[str], cwd: Path) -> AutotuneRun:
        runs.append(AutotuneRun(args, cwd))
        return runs[-1]

    yield start
    for run in runs:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)    # its own session: the group is its PID
            run.proc.wait(timeout=30)


# Every candidate of this space launches: no token budget to fall below max-model-len or max-num-seqs. The
# default space can draw one that the known-constraint check rejects without a launch, and samplers are
# seeded per process, so a test that waits for launched trials would depend on the draw.
LAUNCHABLE_SPACE: dict[str, Any] = {"params": {
    "gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95},
    "max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True}}}

SIM_STUDY: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "engine": {"kind": "sim", "gpu": "H100", "num_gpus": 1, "time_scale": 40,
               "extra_flags": ["--max-model-len", "4096"], "startup_timeout_s": 60},
    "search_space": LAUNCHABLE_SPACE,
    "workload": {"kind": "random", "input_len": 512, "output_len": 64},
    "slo": "ttft:p99<=1s",
    "load": {"mode": "capacity", "search": "concurrency", "max_steps": 3, "requests_per_step": 40, "warmup": 2},
    "telemetry": {"source": "sim", "hz": 5},
    # the confirmation repeats the baseline and the top candidates only: the extra places for close or
    # flagged first runs (tests/unit/test_export_verdict.py) would add repeats to tests about other things
    "confirm": {"max_extra": 0},
}


@pytest.fixture()
def sim_spec(tmp_path: Path):
    """`sim_spec(name, **changes)` writes `tmp_path/NAME.yaml`: an 8B study on one simulated H100 at 40x
    over LAUNCHABLE_SPACE, stored in `tmp_path/NAME.db`, seconds a trial. A dict change merges into that section (`load=
    {"max_steps": 2}` keeps the other load keys); anything else replaces it."""
    import copy

    import yaml

    def write(name: str, **changes: Any) -> Path:
        spec = copy.deepcopy(SIM_STUDY)
        spec.update(name=name, storage=f"sqlite:///{tmp_path}/{name}.db")
        for key, value in changes.items():
            both_dicts = isinstance(value, dict) and isinstance(spec.get(key), dict)
            spec[key] = {**spec[key], **value} if both_dicts else value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write


@pytest.fixture()
def launchable_space() -> dict[str, Any]:
    """A search space whose every candidate launches (see LAUNCHABLE_SPACE)."""
    import copy

    return copy.deepcopy(LAUNCHABLE_SPACE)


@pytest.fixture()
def servers_in():
    """`servers_in(cwd, marker)`: the server processes a test's runs left (should be none)."""
    return _servers_in


@pytest.fixture(scope="session")
def postgres_server() -> Iterator["ThrowawayPostgres"]:
    """A real PostgreSQL server on a free loopback port, started here and stopped (checked by PID) at
    the end of the session; skipped only where the server binaries are absent (`make postgres`)."""
    from autotune.store.pgserver import ThrowawayPostgres, find_bindir

    if find_bindir() is None:
        pytest.skip("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                    "(`make postgres` installs them as root)")
    pg = ThrowawayPostgres().start()
    try:
        yield pg
    finally:
        pg.stop()
    left = [pid for pid in pg.pids if _running(pid)]     # a test may have restarted it (new PIDs)
    assert pg.pids and not left, f"PostgreSQL server(s) {left} still running"


@pytest.fixture()
def postgres_url(postgres_server: "ThrowawayPostgres", request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the session's server, for one test."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:6]
    return postgres_server.create_database(name)


@dataclass
class TakenPort:
    port: int               # held by a listening socket of the test, as another process would hold it
    handed: list[int]       # every port the trial runner asked for, in order


@pytest.fixture()
def taken_port_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[TakenPort]:
    """The trial runner's first port (its lease's HTTP port) is one another socket has just bound (the
    race between choosing a free port and the server binding it); later ones are really free."""
    import socket

    import autotune.node.pool as pool_module
    import autotune.tuner.trial as trial_module

    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = TakenPort(holder.getsockname()[1], [])
    real = trial_module.find_free_port

    def racy_free_port() -> int:
        taken.handed.append(taken.port if not taken.handed else real())
        return taken.handed[-1]

    monkeypatch.setattr(trial_module, "find_free_port", racy_free_port)
    real_block = pool_module.GpuPool._port_block

    def racy_block(self: Any) -> int:
        if not taken.handed:          # the first lease's block starts at the taken port
            return racy_free_port()
        return real_block(self)

    monkeypatch.setattr(pool_module.GpuPool, "_port_block", racy_block)
    try:
        yield taken
    finally:
        holder.close()


# Trace replays (issue 16): the send-time bound is half the trace's median gap between requests; within
# it no two requests swap places and a burst reaches the server as a burst.
DRIFT_BOUND_GAPS = 0.5
LOOP_STARVED_MS = 20.0    # autotune.bench.health's own limit on the event loop's p99 lag
# ... or a lag of at least this share of the drift: the lag's p99 is over the monitor's many samples, the
# drift's over 24 sends (nearly their maximum), so a starved client showed 19 ms of lag p99 beside a send
# 36 ms late (pool run 3, three jobs on two cores); a late schedule with an idle loop stays a failure
STARVED_SHARE = 0.25
# ... or most sends on time: a median drift under this share of the gap says the schedule was kept and a
# few sends met a stall the monitor's p99 (over ~400 ticks) does not show (seen: p50 0.7 ms, p99 36.6 ms,
# loop lag p99 5.6 ms, in a pool run); a replay late throughout (its median too) stays a failure
KEPT_MEDIAN_GAPS = 0.1


async def _replay_on_schedule(replay, attempts: int = 3):
    """Run `replay()` (async, returning (metrics, client health as a dict)) until one replay holds the
    send-time bound; returns that one. This 2-core machine is shared, and at times does not run the
    test process for tens of ms: a replay beyond the bound must then say so (client saturated, "fell
    behind the trace"), never pass silently, and is run again. When every replay was beyond it and the
    client's own event-loop monitor saw the process starved each time, the bound cannot be judged now
    (skip, with the numbers); beyond it with the loop keeping time is a failure."""
    seen: list[tuple[float, float, float]] = []   # (p99 drift, event-loop lag p99, p50 drift) beyond the bound
    for _ in range(attempts):
        metrics, client = await replay()
        gap = metrics["median_send_gap_ms"]
        if metrics["p99_send_drift_ms"] < DRIFT_BOUND_GAPS * gap:
            return metrics, client
        assert client["saturated"] and "fell behind the trace" in client["note"], (metrics, client)
        seen.append((metrics["p99_send_drift_ms"], client["loop_lag_p99_ms"] or 0.0,
                     metrics["median_send_drift_ms"]))
    said = "; ".join(f"p99 drift {d:.1f} ms (p50 {p50:.1f}) with event-loop lag p99 {lag:.1f} ms"
                     for d, lag, p50 in seen)
    if all(lag > LOOP_STARVED_MS or lag >= STARVED_SHARE * drift or p50 < KEPT_MEDIAN_GAPS * gap
           for drift, lag, p50 in seen):
        pytest.skip(f"the machine starved the client in every replay (each flagged): {said}")
    pytest.fail(f"replays fell behind the trace while the client's loop kept time: {said}")


@pytest.fixture()
def replay_on_schedule():
    return _replay_on_schedule


def _wait_until(condition: Any, timeout: float = 60.0, what: Any = "the condition", every: float = 0.05) -> Any:
    """Poll `condition()` until it returns something truthy, and return that. A test waits for the event
    it needs this way, never for a fixed time: a loaded two-core machine makes every event late, and a
    sleep followed by an assertion on what happened meanwhile fails there. `timeout` is a generous cap
    (the event is not expected to need it); past it the test fails with `what` (a string, or a callable
    giving one, e.g. the output so far)."""
    import time

    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            pytest.fail(f"gave up after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(every)


@pytest.fixture()
def wait_until():
    """`wait_until(condition, timeout=60, what=...)`: see _wait_until."""
    return _wait_until


@pytest.fixture()
def mock_in_thread() -> Iterator[str]:
    """The mock server (batch model: 2 ms a step + 0.25 ms a sequence) on its own event loop in a thread,
    for code that runs asyncio itself or in another process; yields its base URL."""
    import asyncio
    import threading

    from autotune.bench.mockserver import MockConfig, build_app, serve

    ready, box = threading.Event(), {}

    def main() -> None:
        loop = asyncio.new_event_loop()

        async def run() -> None:
            done = asyncio.Event()
            async with serve(build_app(MockConfig(mode="batch", step_ms=2, per_seq_ms=0.25))) as url:
                box.update(url=url, done=done, loop=loop)
                ready.set()
                await done.wait()

        loop.run_until_complete(run())

    t = threading.Thread(target=main, daemon=True)
    t.start()
    assert ready.wait(30)
    yield box["url"]
    box["loop"].call_soon_threadsafe(box["done"].set)
    t.join(30)
