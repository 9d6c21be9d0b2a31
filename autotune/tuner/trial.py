"""One trial, one path (DESIGN.md, principle 3): candidate flags -> free checks -> launch -> ready ->
load -> telemetry -> observations. The CLI, tests and benchmarks all come through `TrialRunner.run`.

The runner never raises for a bad candidate: every way a candidate can fail ends as a `TrialOutcome`
with its cause. Only an interrupt (Ctrl-C, SIGTERM, the invocation's timeout) escapes, after the server
is stopped.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil

from autotune import causes
from autotune.bench import find_capacity, parse_workload, run_load
from autotune.bench.capacity import capacity_tps
from autotune.bench.client import STALLED, stalled_requests
from autotune.bench.results import CapacityResult, Measurement
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.engine.logparse import port_in_use
from autotune.engine.process import find_free_port, write_log_header
from autotune.errors import UserError
from autotune.redact import Redactor, api_key_of
from autotune.spec import StudySpec
from autotune.store.repository import ResultStore
from autotune.telemetry import objectives as telemetry_objectives
from autotune.telemetry.base import TelemetrySource, TelemetrySummary, TelemetryTarget


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


Phase = Callable[[str], None]
PORT_ATTEMPTS = 3   # launches of one candidate when its port is taken before the server binds it


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
    def run(self, number: int, flags: Sequence[str], violations: Sequence[str], phase: Phase) -> TrialOutcome:
        if violations:
            return TrialOutcome("failed", causes.CONSTRAINT, "; ".join(violations))
        all_flags = [*self.fixed_flags, *flags]
        if self.predict is not None:
            pred = self.predict(all_flags)
            if pred is not None and not pred.fits:
                return TrialOutcome("failed", causes.PREDICTED_OOM, f"predicted out of memory: {pred.reason}")
        log_path = self.log_dir / f"trial-{number:04d}.log"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = find_free_port()
            try:  # autotune's own line first: a log that cannot be written (disk full) fails here, cleanly
                write_log_header(log_path, f"trial {number}, attempt {attempt}, port {port}")
            except OSError as e:
                return TrialOutcome("failed", causes.CRASH, f"cannot write the trial log {log_path}: "
                                    f"{e.strerror or e}; not launched", log_path=str(log_path))
            outcome = self._launch_and_serve(all_flags, port, log_path, phase)
            # Another process took the port between find_free_port and the server's bind: not the
            # candidate's fault, so the same candidate is launched again on a new port.
            if outcome.startup is None and port_in_use(outcome.log_tail or "") and attempt < PORT_ATTEMPTS:
                phase(f"port {port} was taken before the server bound it; retrying on a new port")
                continue
            return self._redacted(outcome, log_path)
        raise AssertionError("unreachable")

    def _launch_and_serve(self, all_flags: list[str], port: int, log_path: Path, phase: Phase) -> TrialOutcome:
        phase(f"starting {self.engine.name} on port {port}")
        request = LaunchRequest(model=self.spec.model, flags=all_flags, port=port, log_path=log_path,
                                gpus=self.spec.gpus, env=self.spec.engine.env,
                                startup_timeout_s=self.spec.engine.startup_timeout_s)
        server = self.engine.launch(request)
        record_id = self._register(server, port)
        outcome: TrialOutcome | None = None
        try:
            outcome = self._serve(server, phase, log_path)
            return outcome
        finally:
            phase("stopping server")
            server.stop()
            self.store.forget_process(record_id)
            if outcome is None or not (outcome.startup is None and port_in_use(outcome.log_tail or "")):
                self.engine.release_wait(port, self.spec.gpus)   # (a port someone else holds is never released)
            self.redactor.file(log_path)

    def _redacted(self, outcome: TrialOutcome, log_path: Path) -> TrialOutcome:
        """What vLLM said, without the study's secrets: the detail and log tail are stored and shown."""
        outcome.detail = self.redactor.text(outcome.detail)
        outcome.log_tail = self.redactor.text(outcome.log_tail)
        return outcome

    def _register(self, server: Server, port: int) -> int:
        try:
            created = psutil.Process(server.pid).create_time()
        except psutil.Error:
            created = 0.0
        return self.store.register_process(study_name=self.spec.name, pid=server.pid,
                                           pgid=getattr(server, "pgid", server.pid), create_time=created,
                                           owner_pid=os.getpid(), port=port)

    def _serve(self, server: Server, phase: Phase, log_path: Path) -> TrialOutcome:
        try:
            phase("waiting for /health")
            startup = server.wait_ready()
        except EngineFailure as f:
            return TrialOutcome("failed", f.cause, f.detail, log_tail=f.log_tail or server.log_tail(),
                                log_path=str(log_path))
        sampler = self.telemetry.sampler(TelemetryTarget(server_pid=server.pid, gpus=self.spec.gpus,
                                                         server_url=server.url), hz=self.spec.telemetry.hz)
        sampler.start()
        t0 = time.monotonic()
        hung: str | None = None
        try:
            measurement, capacity, stalled = self._measure(server.url, phase)
        except UserError as e:
            measurement, capacity, stalled = None, None, 0
            if server.failure() is None:
                if STALLED not in str(e):  # the server is up and answering: a real usage error
                    raise
                hung = f"server stopped answering: {e}"   # e.g. every warm-up request stalled
        finally:
            summary = sampler.stop()
        elapsed = time.monotonic() - t0
        died = server.failure()
        outcome = TrialOutcome("ok", startup=startup, telemetry=summary, log_path=str(log_path),
                               log_tail=server.log_tail())
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
        outcome.observed = self._observe(measurement, capacity, summary, elapsed)
        if measurement.client.saturated:
            outcome.cause = causes.CLIENT_SATURATED
            outcome.detail = f"load generator saturated: {measurement.client.note}"
        return outcome

    def _measure(self, url: str, phase: Phase) -> tuple[Measurement | None, dict[str, Any] | None, int]:
        """The measurement, the capacity search's record (None for a fixed load) and how many requests
        the server stopped answering (stalled)."""
        load = self.spec.load
        model = self.spec.model
        if load.mode == "fixed":
            phase(f"load: {'concurrency ' + str(load.concurrency) if load.concurrency else f'rate {load.rate}/s'}")
            m = asyncio.run(run_load(url, model, self.workload, concurrency=load.concurrency, rate=load.rate,
                                     num_requests=load.num_requests, warmup=load.warmup, slo=self.slo,
                                     seed=self.spec.seed, endpoint=load.endpoint, tokenizer=self.tokenizer,
                                     stall_timeout_s=load.stall_timeout_s, api_key=self.api_key))
            return m, None, stalled_requests(m.records)

        def on_step(step: Any) -> None:
            if step.measurement.aborted_early:
                phase(f"capacity search: {load.search} {step.load:g} -> SLO clearly broken, step cut short")
                return
            met = "meets SLO" if step.slo_met else "breaks SLO"
            phase(f"capacity search: {load.search} {step.load:g} -> "
                  f"{step.measurement.metrics.get('output_throughput', 0):.0f} tok/s, {met}")

        phase(f"capacity search by {load.search}")
        cap: CapacityResult = asyncio.run(find_capacity(
            url, model, self.workload, self.slo, search=load.search, max_steps=load.max_steps,
            requests_per_step=load.requests_per_step, warmup=load.warmup, seed=self.spec.seed,
            tokenizer=self.tokenizer, on_step=on_step, stall_timeout_s=load.stall_timeout_s,
            api_key=self.api_key))
        chosen = cap.at_capacity or (cap.steps[0].measurement if cap.steps else None)
        info = {"mode": cap.mode, "capacity": cap.capacity, "cache_reset": cap.cache_reset, "note": cap.note,
                "steps": [{"load": s.load, "slo_met": s.slo_met,
                           "prefix_cache_hit_pct": s.measurement.metrics.get("prefix_cache_hit_pct"),
                           "output_throughput": s.measurement.metrics.get("output_throughput"),
                           "steady_output_throughput": s.measurement.metrics.get("steady_output_throughput"),
                           "p99_ttft_ms": s.measurement.metrics.get("p99_ttft_ms"),
                           "median_tpot_ms": s.measurement.metrics.get("median_tpot_ms"),
                           "completed": s.measurement.metrics.get("completed"),
                           "total_output_tokens": s.measurement.metrics.get("total_output_tokens"),
                           "failed": s.measurement.metrics.get("failed"),
                           "aborted_early": s.measurement.aborted_early} for s in cap.steps]}
        return chosen, info, sum(stalled_requests(s.measurement.records) for s in cap.steps)

    def _observe(self, m: Measurement, capacity: dict[str, Any] | None, summary: TelemetrySummary,
                 elapsed: float) -> dict[str, float]:
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
            steps_tokens = int(sum((s.get("total_output_tokens") or 0) for s in capacity["steps"]))
        num_gpus = max(self.spec.num_gpus, 1)
        out.update(telemetry_objectives(summary, output_tokens=steps_tokens, duration_s=elapsed,
                                        num_gpus=num_gpus, output_tps=out.get("capacity_tps", out.get("output_tps", 0.0))))
        return out


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
    }
