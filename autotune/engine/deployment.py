"""A candidate that is a deployment: prefill and decode instances with a router in front (issue 26).

`launch(engine, request)` is what the trial runner calls for every candidate. A candidate without PD
flags (pdlayout.py) is one server, launched by the engine as always. One with `--pd-prefill N --pd-decode
M` becomes N + M servers launched by the same engine (vLLM, or the simulator standing in for it), each
with the candidate's other flags, a `--kv-transfer-config` for NixlConnector, its own slice of the
lease's GPUs (CUDA_VISIBLE_DEVICES), its own HTTP port, NIXL side-channel port and log file, and then
`autotune router` on the trial's port with the trial's log. Every process is its own process group with
the parent-death signal (engine/process.py), so the deployment starts, is health-checked and stops as
one, and a killed tuner leaves none of it behind. Whichever process dies first fails the whole
deployment, and the failure names it: "decode instance 0 (port 41234) exited: ...".
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx

from autotune import causes
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.engine.process import find_free_port, port_free, spawn, write_log_header
from autotune.engine.vllm import VLLMServer
from autotune.flags import flags_to_mapping, parallel_size
from autotune.pdlayout import KV_TRANSFER_FLAG, PDLayout, split_pd_flags

_POLL_S = 0.25
_HEALTH_TIMEOUT_S = 2.0
# Per-launch ports vLLM takes from the environment: the lease's block belongs to the first instance;
# the others let vLLM pick free ones, so that two instances on one host never share one.
_LEASE_PORT_ENV = ("VLLM_PORT", "VLLM_DP_MASTER_PORT")


@dataclass
class Member:
    """One process of a deployment: what it is called in a failure, its server, port, GPUs and log."""

    name: str
    server: Server
    port: int
    gpus: tuple[int, ...]
    role: str                     # prefill | decode | router


def launch(engine: Engine, request: LaunchRequest) -> Server:
    """The candidate's server: one from the engine, or a Deployment when its flags name a PD layout."""
    layout, flags = split_pd_flags(request.flags)
    if layout is None:
        return engine.launch(request)
    return Deployment.start(engine, request, layout, flags)


def members_of(server: Server, port: int, gpus: Sequence[int]) -> list[Member]:
    """Every process a launch started (a plain server is its own only member), for the runner's
    bookkeeping: registering PIDs, redacting logs, waiting for ports and GPUs to be released."""
    if isinstance(server, Deployment):
        return list(server.members)
    return [Member("server", server, port, tuple(gpus), "server")]


def startup_log(server: Server) -> Path:
    """The log whose startup lines describe the serving capacity: a deployment's first decode instance's
    (its router's log says nothing of KV caches), else the server's own."""
    if isinstance(server, Deployment):
        return next(m.server.log_path for m in server.members if m.role == "decode")
    return server.log_path


def _instance_log(log_path: Path, role: str, index: int) -> Path:
    return log_path.with_name(f"{log_path.stem}.{role}-{index}{log_path.suffix or '.log'}")


class Deployment(Server):
    """N prefill + M decode instances and the router, as one Server: its URL and PID are the router's."""

    def __init__(self, members: list[Member], startup_timeout_s: float, started: float):
        self.members = members
        self.router = members[-1]
        self.instances = members[:-1]
        self.pid = self.router.server.pid
        self.pgid = getattr(self.router.server, "pgid", self.pid)
        self.url = self.router.server.url
        self.log_path = self.router.server.log_path
        self.startup_timeout_s = startup_timeout_s
        self._started = started
        self._failure: EngineFailure | None = None
        self._stopped = False

    @classmethod
    def start(cls, engine: Engine, request: LaunchRequest, layout: PDLayout, flags: Sequence[str]) -> "Deployment":
        """Launch every instance, then the router; nothing is waited for here (wait_ready does)."""
        per = parallel_size(flags_to_mapping(flags))
        gpus = tuple(request.gpus)
        if gpus and len(gpus) < per * layout.instances:
            raise ValueError(f"{layout.label} with {per} GPU(s) per instance needs {per * layout.instances} "
                             f"GPUs; the launch was given {len(gpus)}")
        started = time.monotonic()
        kv = [KV_TRANSFER_FLAG, layout.kv_transfer_config()]
        members: list[Member] = []
        taken = {request.port}
        roles = [("prefill", i) for i in range(layout.prefill)] + [("decode", i) for i in range(layout.decode)]
        try:
            for k, (role, i) in enumerate(roles):
                port = _fresh_port(taken)
                side = _fresh_port(taken, per)
                mine = gpus[k * per:(k + 1) * per] if gpus else ()
                env = dict(request.env)
                if k > 0:
                    for name in _LEASE_PORT_ENV:
                        env.pop(name, None)
                env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side)
                log_path = _instance_log(request.log_path, role, i)
                name = f"{role} instance {i} (port {port})"
                write_log_header(log_path, f"{name} of {layout.label}, GPUs {list(mine) or 'none'}, "
                                           f"NIXL side channel {side}")
                server = engine.launch(LaunchRequest(
                    model=request.model, flags=[*flags, *kv], port=port, log_path=log_path, gpus=mine, env=env,
                    startup_timeout_s=request.startup_timeout_s, cores=request.cores))
                members.append(Member(name, server, port, tuple(mine), role))
            members.append(_start_router(request, members))
        except BaseException:
            for m in reversed(members):
                m.server.stop(grace_s=5.0)
            raise
        return cls(members, request.startup_timeout_s, started)

    # ---- readiness -----------------------------------------------------------------------------------
    def wait_ready(self) -> StartupInfo:
        """Every instance's /health, then the router's; the first process to die (or the clock) ends it."""
        deadline = self._started + self.startup_timeout_s
        pending = list(self.members)
        with httpx.Client(timeout=_HEALTH_TIMEOUT_S, trust_env=False) as client:
            while pending:
                died = self._first_death()
                if died is not None:
                    raise died
                for m in list(pending):
                    if m is self.router and len(pending) > 1:
                        continue   # the router answers 200 only once every instance does
                    try:
                        if client.get(m.server.url + "/health").status_code == 200:
                            pending.remove(m)
                    except httpx.HTTPError:
                        pass
                if pending and time.monotonic() >= deadline:
                    self.stop(grace_s=5.0)
                    names = ", ".join(m.name for m in pending)
                    self._failure = EngineFailure(
                        causes.STARTUP_TIMEOUT, f"not ready within {self.startup_timeout_s:g} s: {names}",
                        log_tail=self.log_tail())
                    raise self._failure
                if pending:
                    time.sleep(_POLL_S)
        infos = [m.server.wait_ready() for m in self.members]   # each is healthy: these return at once
        decode = next(info for m, info in zip(self.members, infos) if m.role == "decode")
        return StartupInfo(startup_seconds=round(time.monotonic() - self._started, 3),
                           kv_cache_tokens=decode.kv_cache_tokens, max_concurrency=decode.max_concurrency,
                           init_engine_seconds=decode.init_engine_seconds, model_memory_gib=decode.model_memory_gib,
                           graph_capture_seconds=decode.graph_capture_seconds,
                           engine_version=decode.engine_version, simulated=decode.simulated, phases=None)

    # ---- failure -------------------------------------------------------------------------------------
    def _first_death(self) -> EngineFailure | None:
        """The failure of the first member found dead, named, after stopping every other member."""
        if self._failure is not None:
            return self._failure
        if self._stopped:
            return None
        for m in self.members:
            if m.server.alive():
                continue
            got = m.server.failure()
            if got is None:   # stopped by us meanwhile
                continue
            self.stop(grace_s=5.0)
            tail = f"[{m.name}: {m.server.log_path}]\n{got.log_tail}"
            self._failure = EngineFailure(got.cause, f"{m.name} exited: {got.detail}", log_tail=tail,
                                          exit_code=got.exit_code)
            return self._failure
        return None

    def alive(self) -> bool:
        return all(m.server.alive() for m in self.members)

    def failure(self) -> EngineFailure | None:
        return self._first_death()

    def stop(self, grace_s: float = 15.0) -> None:
        """The router first (no new requests reach an instance that is stopping), then the instances."""
        if self._stopped:
            return
        self._stopped = True
        for m in [self.router, *self.instances]:
            m.server.stop(grace_s=grace_s)

    def log_tail(self, lines: int = 40) -> str:
        """A few lines of every process's log, each under its name (a failure's tail is the dead one's)."""
        if self._failure is not None and self._failure.log_tail:
            return self._failure.log_tail
        each = max(lines // len(self.members), 5)
        return "\n".join(f"[{m.name}: {m.server.log_path}]\n{m.server.log_tail(each)}" for m in self.members)


def _fresh_port(taken: set[int], block: int = 1) -> int:
    """A free port, and the `block - 1` after it free too, none given to another process of this
    deployment (NIXL's side channel listens on its base port plus each TP rank)."""
    while True:
        port = find_free_port()
        ports = set(range(port, port + block))
        if not ports & taken and all(port_free(p) for p in range(port + 1, port + block)):
            taken.update(ports)
            return port


def _start_router(request: LaunchRequest, instances: list[Member]) -> Member:
    """`autotune router` on the trial's port, its output in the trial's own log."""
    urls = {role: [f"http://127.0.0.1:{m.port}" for m in instances if m.role == role] for role in ("prefill", "decode")}
    argv = [sys.executable, "-m", "autotune", "router", "--host", "127.0.0.1", "--port", str(request.port),
            "--prefill", *urls["prefill"], "--decode", *urls["decode"]]
    offset = request.log_path.stat().st_size if request.log_path.exists() else 0
    started = time.monotonic()
    popen = spawn(argv, request.log_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cores=request.cores)
    own = LaunchRequest(model=request.model, flags=[], port=request.port, log_path=request.log_path,
                        startup_timeout_s=request.startup_timeout_s, cores=request.cores)
    return Member(f"router (port {request.port})", VLLMServer(popen, argv, own, offset, started), request.port, (),
                  "router")
