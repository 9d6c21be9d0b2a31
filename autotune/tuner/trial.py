"""One trial, one path (DESIGN.md, principle 3): candidate flags -> free checks -> launch -> ready ->
load -> telemetry -> observations. The CLI, tests and benchmarks all come through `TrialRunner.run`.

The server is started, watched and stopped here, in the calling (job) thread; the load and the
telemetry run in a measurement worker process of their own (tuner/measure.py over node/worker.py),
started beside the server so that it has booted by the time the server answers.

The runner never raises for a bad candidate: every way a candidate can fail ends as a `TrialOutcome`
with its cause. Only an interrupt (Ctrl-C, SIGTERM, the invocation's timeout) escapes, after the server
is stopped; one that arrives after the measurement completed is noted and the outcome returned.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import psutil

from autotune import causes
from autotune.bench import parse_workload
from autotune.bench.client import STALLED
from autotune.bench.metrics import capacity_tps
from autotune.bench.results import Measurement
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.engine.deployment import launch as launch_server, members_of, startup_log
from autotune.bench.step_bounds import ServerLimits
from autotune.engine.logparse import logged_kv_tokens, port_in_use
from autotune.engine.process import confine, find_free_port, write_log_header
from autotune.errors import UserError
from autotune.redact import Redactor, api_key_of
from autotune.spec import StudySpec
from autotune.store.repository import ResultStore
from autotune.telemetry import objectives as telemetry_objectives
from autotune.telemetry.base import TelemetrySource, TelemetrySummary
from autotune.node.interrupts import current_gate, interruptible
from autotune.node.heartbeat import process_create_time
from autotune.node.pool import format_cpulist, host_name
from autotune.node.worker import Worker, WorkerDied
from autotune.tuner.measure import TARGET, EarlyStopRequest, MeasureRequest, TelemetryRequest, measure

if TYPE_CHECKING:
    from autotune.node.pool import Lease


@dataclass
class TrialOutcome:
    state: str                            # ok | infeasible | failed
    cause: str | None = None
    detail: str | None = None
    observed: dict[str, float] = field(default_factory=dict)   # measured objective candidates
    metrics: dict[str, Any] = field(default_factory=dict)
    capacity: dict[str, Any] | None = None
    telemetry: TelemetrySummary | None = None
    startup: StartupInfo | None = None
    measurement: Measurement | None = None
    log_tail: str | None = None
    log_path: str | None = None
    flags: list[str] = field(default_factory=list)   # measurement flags (bench/measurement_flags.py)
    client: dict[str, Any] | None = None   # the measurement worker's pid, CPU and wall seconds (measure.ClientUse)


Phase = Callable[[str], None]
PORT_ATTEMPTS = 3   # launches of one candidate when its port is taken before the server binds it


@dataclass
class _Launch:
    """What every launch attempt of one trial shares (a retry changes only the port)."""

    flags: list[str]
    log_path: Path
    gpus: list[int]
    env: dict[str, str]
    cores: tuple[int, ...]
    seed: int
    stopper: Any = None        # tuner/earlystop.EarlyStop, or None
    claim: float | None = None   # a load the capacity search must settle (a confirmation repeat's check)
    hint: tuple[float, float | None] | None = None   # where the capacity search starts (bench/capacity.py)
    before_load: Callable[[], None] | None = None    # waited for between /health and the first request
    client_cores: tuple[int, ...] = ()   # the measurement worker's (the CPU build: apart from the server's)
    compute_cores: tuple[int, ...] = ()  # the CPU build's server, once ready: all of it moves here


class TrialRunner:
    def __init__(self, spec: StudySpec, engine: Engine, telemetry: TelemetrySource, store: ResultStore,
                 log_dir: Path, fixed_flags: Sequence[str], predict: Callable[[Sequence[str]], Any] | None):
        self.spec = spec
        self.engine = engine
        self.telemetry = telemetry
        self.store = store
        self.log_dir = log_dir
        self.fixed_flags = list(fixed_flags)
        self.predict = predict
        self.workload = parse_workload(spec.workload)
        self.slo = spec.slo_obj
        self.tokenizer = spec.model if Path(spec.model).is_dir() else None
        self.api_key = api_key_of(self.fixed_flags, spec.engine.env)
        self.redactor = Redactor.for_engine(spec.engine.env, self.fixed_flags, getattr(engine, "command", ()))

    # ------------------------------------------------------------------------------------------------
    def precheck(self, flags: Sequence[str], violations: Sequence[str]) -> TrialOutcome | None:
        """The free checks (known constraints, the memory model): a failed outcome, or None to launch."""
        if violations:
            return TrialOutcome("failed", causes.CONSTRAINT, "; ".join(violations))
        if self.predict is not None:
            pred = self.predict([*self.fixed_flags, *flags])
            if pred is not None and not pred.fits:
                return TrialOutcome("failed", causes.PREDICTED_OOM, f"predicted out of memory: {pred.reason}")
        return None

    def run(self, number: int, flags: Sequence[str], violations: Sequence[str], phase: Phase,
            lease: Lease | None = None, *, seed: int | None = None, log_name: str | None = None,
            stopper: Any = None, claim: float | None = None, hint: tuple[float, float | None] | None = None,
            before_load: Callable[[], None] | None = None, env: dict[str, str] | None = None) -> TrialOutcome:
        """`stopper` (tuner/earlystop.EarlyStop) may end the capacity search early. `seed` replaces the spec's prompt seed (a confirmation round draws fresh prompts); `log_name`
        replaces the server log's file name (a confirmation repeat must not overwrite its trial's log);
        `claim` is a load whose pass or fail the capacity search must settle (the first run's highest met
        load, when a confirmation repeat tests it); `hint` is the bracket the capacity search starts from
        (the study's capacities so far); `before_load` is called once the server is ready and before any
        request, so that work overlapping the server's start (the twin's ranking) ends before the load.
        With a lease: the lease's GPUs (CUDA_VISIBLE_DEVICES), its HTTP port and a block of internal
        ports, the server and the measurement worker (load client, telemetry) pinned to its cores (on the
        CPU build, the worker on the lease's last core and the server on the others), telemetry over its
        GPUs only. Without one: the study's GPUs and any free port, as a single trial always ran. `env`:
        what the candidate's env knobs set, on top of the study's engine.env."""
        rejected = self.precheck(flags, violations)
        if rejected is not None:
            return rejected
        gate = current_gate()
        if gate is not None:
            gate.check()
        all_flags = [*self.fixed_flags, *flags]
        log_path = self.log_dir / (log_name or f"trial-{number:04d}.log")
        gpus = list(lease.gpus) if lease is not None else list(self.spec.gpus)
        env = {**self.spec.engine.env, **(env or {})}
        cores: tuple[int, ...] = ()
        client_cores: tuple[int, ...] = ()
        compute_cores: tuple[int, ...] = ()
        if lease is not None:
            cores = client_cores = lease.cores
            # vLLM's internal ports (torch.distributed, data-parallel RPC) start at VLLM_PORT: inside the block
            env.setdefault("VLLM_PORT", str(lease.port_base + 1))
            env.setdefault("VLLM_DP_MASTER_PORT", str(lease.port_base + 4))
            if self.spec.engine.kind == "vllm" and not gpus and cores:
                compute, client_cores = cpu_build_split(cores)
                if set(compute) < _affinity():
                    # the CPU build binds its OpenMP threads itself: to the server's compute share (in a
                    # worker process it spawns; its one-process executor binds nothing, so as many
                    # threads as compute cores, and the whole server moves there once ready)
                    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", format_cpulist(compute))
                    env.setdefault("OMP_NUM_THREADS", str(len(compute)))
                    compute_cores = compute
        launch = _Launch(all_flags, log_path, gpus, env, cores, self.spec.seed if seed is None else seed, stopper,
                         claim, hint, before_load, client_cores, compute_cores)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            # the lease's own port first; a retry takes any free one (the lease's was taken from outside)
            port = lease.port if lease is not None and attempt == 1 else find_free_port()
            try:  # autotune's own line first: a log that cannot be written (disk full) fails here, cleanly
                write_log_header(log_path, f"trial {number}, attempt {attempt}, port {port}")
            except OSError as e:
                return TrialOutcome("failed", causes.CRASH, f"cannot write the trial log {log_path}: "
                                    f"{e.strerror or e}; not launched", log_path=str(log_path))
            outcome = self._launch_and_serve(launch, port, phase)
            # Another process took the port between choosing it and the server's bind: not the
            # candidate's fault, so the same candidate is launched again on a new port.
            if outcome.startup is None and port_in_use(outcome.log_tail or "") and attempt < PORT_ATTEMPTS:
                phase(f"port {port} was taken before the server bound it; retrying on a new port")
                continue
            return self._redacted(outcome, log_path)
        raise AssertionError("unreachable")

    def _launch_and_serve(self, launch: "_Launch", port: int, phase: Phase) -> TrialOutcome:
        phase(f"starting {self.engine.name} on port {port}")
        request = LaunchRequest(model=self.spec.model, flags=launch.flags, port=port, log_path=launch.log_path,
                                gpus=launch.gpus, env={**self._cache_env(), **launch.env}, startup_timeout_s=self.spec.engine.startup_timeout_s,
                                cores=launch.cores)
        worker = Worker(TARGET, cores=launch.client_cores).start()   # boots while the server starts
        try:
            server = launch_server(self.engine, request)   # one server, or a PD deployment (engine/deployment.py)
            members = members_of(server, port, launch.gpus)
            record_ids = [self._register(m.server, m.port) for m in members]
            outcome: TrialOutcome | None = None
            try:
                with interruptible():
                    outcome = self._serve(server, phase, launch, worker)
                return outcome
            finally:
                phase("stopping server")
                worker.close()
                server.stop()
                for record_id in record_ids:
                    self.store.forget_process(record_id)
                if outcome is None or not (outcome.startup is None and port_in_use(outcome.log_tail or "")):
                    for m in members:   # (a port someone else holds is never released)
                        self.engine.release_wait(m.port, m.gpus)
                for m in members:
                    self.redactor.file(m.server.log_path)
        finally:
            worker.close()

    def _redacted(self, outcome: TrialOutcome, log_path: Path) -> TrialOutcome:
        """What vLLM said, without the study's secrets: the detail and log tail are stored and shown."""
        outcome.detail = self.redactor.text(outcome.detail)
        outcome.log_tail = self.redactor.text(outcome.log_tail)
        return outcome

    def _cache_env(self) -> dict[str, str]:
        """Compilation caches on disk under the study's folder, shared by its trials (engine/cache.py)."""
        if not self.spec.engine.compile_cache or self.spec.engine.kind != "vllm":
            return {}
        from autotune.engine.cache import compile_cache_env
        return compile_cache_env(self.log_dir.parent / f"{self.spec.name}-cache")

    def _register(self, server: Server, port: int) -> int:
        try:
            created = psutil.Process(server.pid).create_time()
        except psutil.Error:
            created = 0.0
        return self.store.register_process(study_name=self.spec.name, pid=server.pid,
                                           pgid=getattr(server, "pgid", server.pid), create_time=created,
                                           owner_pid=os.getpid(), port=port, host=host_name(),
                                           owner_create_time=process_create_time())

    def _serve(self, server: Server, phase: Phase, launch: _Launch, worker: Worker) -> TrialOutcome:
        log_path, gpus, stopper = launch.log_path, launch.gpus, launch.stopper
        try:
            phase("waiting for /health")
            startup = server.wait_ready()
        except EngineFailure as f:
            return TrialOutcome("failed", f.cause, f.detail, log_tail=f.log_tail or server.log_tail(),
                                log_path=str(log_path))
        if launch.compute_cores:      # the load client's core is its own from here (engine/process.confine)
            confine(server.pid, launch.compute_cores)
        if launch.before_load is not None:
            launch.before_load()
        try:
            got = measure(worker, self._request(server, launch), phase)
        except WorkerDied as e:     # not the candidate's doing: the driver re-queues it (causes.WORKER_DIED)
            return TrialOutcome("failed", causes.WORKER_DIED, str(e), startup=startup, log_path=str(log_path),
                                log_tail=server.log_tail())
        measurement = Measurement.from_dict(got.measurement) if got.measurement is not None else None
        capacity, stalled, hung = got.capacity, got.stalled, None
        if got.error is not None and server.failure() is None:
            if STALLED not in got.error and "cannot reach the server" not in got.error:
                raise UserError(got.error)   # the server is up and answering: a real usage error
            # every warm-up request stalled, or the process lives but refuses connections mid-trial
            hung = f"server stopped answering: {got.error}"
        summary = TelemetrySummary(**got.telemetry)
        died = server.failure()
        if died is None and (hung is not None or _requests_failed(measurement, capacity)):
            died = _exit_within(server, EXIT_GRACE_S)
        outcome = TrialOutcome("ok", startup=startup, telemetry=summary, log_path=str(log_path),
                               log_tail=server.log_tail(), client=got.client.to_json())
        if died is not None:
            outcome.state, outcome.cause, outcome.detail = "failed", died.cause, died.detail
            return outcome
        if stalled and hung is None:
            hung = (f"server stopped answering mid-stream: {stalled} request(s) got no byte for "
                    f"{self.spec.load.stall_timeout_s:g} s while the process kept running")
        if hung is not None:  # alive but hung: its numbers would measure the hang, not the candidate
            outcome.state, outcome.cause, outcome.detail = "failed", causes.CRASH, hung
            return outcome
        assert measurement is not None
        outcome.measurement = measurement
        outcome.metrics = dict(measurement.metrics)
        outcome.capacity = capacity
        outcome.observed = self._observe(measurement, capacity, summary, got.elapsed_s, len(gpus))
        outcome.flags = list(capacity["measurement_flags"]) if capacity is not None else measurement.flags
        if stopper is not None and got.bound is not None:   # search hook: early stopping (tuner/earlystop.py)
            from autotune.tuner.earlystop import mark_stopped
            stopper.bound = got.bound
            mark_stopped(outcome, stopper.bound)
        elif measurement.client.saturated:
            outcome.cause = causes.CLIENT_SATURATED
            outcome.detail = f"load generator saturated: {measurement.client.note}"
        return outcome

    def _request(self, server: Server, launch: _Launch) -> MeasureRequest:
        """What the measurement worker needs: where, what load, which telemetry; the spec itself stays here."""
        stopper = launch.stopper
        early = None if stopper is None else EarlyStopRequest(
            objectives=stopper.objectives, directions=["maximize" if m else "minimize" for m in stopper.maximize],
            front=stopper.front, integer=stopper.integer, num_gpus=stopper.num_gpus)
        return MeasureRequest(
            url=server.url, model=self.spec.model, workload=dict(self.spec.workload), slo=self.spec.slo,
            load=self.spec.load.model_dump(), seed=launch.seed, tokenizer=self.tokenizer, api_key=self.api_key,
            hint=launch.hint, claim=launch.claim, early_stop=early, log_path=str(launch.log_path),
            more_logs=[str(m.server.log_path) for m in members_of(server, 0, ()) if m.server.log_path != launch.log_path],
            limits=asdict(ServerLimits.from_flags(launch.flags, logged_kv_tokens(startup_log(server)))),
            telemetry=TelemetryRequest(source=self.telemetry.name, hz=self.spec.telemetry.hz,
                                       server_pid=server.pid, gpus=list(launch.gpus), server_url=server.url))

    def _observe(self, m: Measurement, capacity: dict[str, Any] | None, summary: TelemetrySummary,
                 elapsed: float, n_gpus: int) -> dict[str, float]:
        metrics = m.metrics
        out: dict[str, float] = {}
        for name, key in (("output_tps", "output_throughput"), ("p99_ttft_ms", "p99_ttft_ms"),
                          ("p50_tpot_ms", "median_tpot_ms")):
            if metrics.get(key) is not None:
                out[name] = float(metrics[key])
        if capacity is not None:
            out["capacity_tps"] = float(capacity_tps(metrics) or 0.0) if capacity["capacity"] else 0.0
        # Telemetry spans the whole load window, so energy per token counts every measured step's tokens.
        steps_tokens = int(metrics.get("total_output_tokens") or 0)
        if capacity is not None:
            steps_tokens = int(sum((s.get("total_output_tokens") or 0) + (s.get("discarded_output_tokens") or 0)
                                   for s in capacity["steps"]))   # a discarded run drew energy too
        num_gpus = max(self.spec.num_gpus if self.spec.engine.kind == "sim" else n_gpus, 1)
        out.update(telemetry_objectives(summary, output_tokens=steps_tokens, duration_s=elapsed,
                                        num_gpus=num_gpus, output_tps=out.get("capacity_tps", out.get("output_tps", 0.0))))
        return out


def cpu_build_split(cores: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(server compute cores, load-client cores) of a CPU-build lease. The CPU build's OpenMP threads spin
    on every core they are bound to, so a client on those cores is starved: its timestamps come late, it
    flags itself `client_saturated`, and the trial is never exported unconfirmed. With two cores or more
    the compute threads get all but the last and the client the last. The server starts on the whole
    lease, so its imports are not squeezed onto the compute cores (pinned there, a start under load took
    over five minutes here), and moves onto them once ready, its HTTP front end included: the client's
    core is then its own. With one core, both share it."""
    cores = tuple(cores)
    if len(cores) < 2:
        return cores, cores
    return cores[:-1], cores[-1:]


def _affinity() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def outcome_evidence(outcome: TrialOutcome) -> dict[str, Any]:
    """The columns of autotune_trials that come from an outcome (placeholders never included)."""
    from autotune.telemetry import summary_for_store

    startup = asdict(outcome.startup) if outcome.startup else None
    return {
        "state": outcome.state, "cause": outcome.cause, "detail": outcome.detail,
        "metrics": outcome.metrics, "capacity": outcome.capacity,
        "telemetry": summary_for_store(outcome.telemetry) if outcome.telemetry else None,
        "startup": startup, "startup_seconds": outcome.startup.startup_seconds if outcome.startup else None,
        "kv_cache_tokens": outcome.startup.kv_cache_tokens if outcome.startup else None,
        "simulated": bool(outcome.startup and outcome.startup.simulated),
        "log_path": outcome.log_path, "log_tail": outcome.log_tail,
        "measurement_flags": list(outcome.flags), "client": outcome.client,
    }


# A server that dies under load has closed its sockets before its process is gone (the kernel closes a
# dying process's files before its parent can reap it; vLLM's API server shuts down only after noticing
# that its engine core died), so the client's failed requests can come back while the process still
# looks alive. Judged at once, such a trial would be "ok" with the figures of its surviving requests.
EXIT_GRACE_S = 5.0


def _requests_failed(measurement: Measurement | None, capacity: dict[str, Any] | None) -> bool:
    if measurement is not None and measurement.metrics.get("failed"):
        return True
    return any(step.get("failed") for step in (capacity or {}).get("steps", []))


def _exit_within(server: Server, grace_s: float) -> EngineFailure | None:
    """The server's cause of death if it dies within grace_s; None if it is still running then."""
    deadline = time.monotonic() + grace_s
    while (died := server.failure()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return died

