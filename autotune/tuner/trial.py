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
from autotune.bench.results import CapacityResult, Measurement
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo
from autotune.engine.process import find_free_port
from autotune.errors import UserError
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
        port = find_free_port()
        phase(f"starting {self.engine.name} on port {port}")
        request = LaunchRequest(model=self.spec.model, flags=all_flags, port=port, log_path=log_path,
                                gpus=self.spec.gpus, env=self.spec.engine.env,
                                startup_timeout_s=self.spec.engine.startup_timeout_s)
        server = self.engine.launch(request)
        record_id = self._register(server, port)
        try:
            return self._serve(server, phase, log_path)
        finally:
            phase("stopping server")
            server.stop()
            self.store.forget_process(record_id)
            self.engine.release_wait(port, self.spec.gpus)

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
        try:
            measurement, capacity = self._measure(server.url, phase)
        except UserError:
            if server.failure() is None:  # the server is up: a real usage error
                raise
            measurement, capacity = None, None  # it died under load (e.g. runtime OOM): a failed trial
        finally:
            summary = sampler.stop()
        elapsed = time.monotonic() - t0
        died = server.failure()
        outcome = TrialOutcome("ok", startup=startup, telemetry=summary, log_path=str(log_path),
                               log_tail=server.log_tail())
        if died is not None:
            outcome.state, outcome.cause, outcome.detail = "failed", died.cause, died.detail
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

    def _measure(self, url: str, phase: Phase) -> tuple[Measurement | None, dict[str, Any] | None]:
        load = self.spec.load
        model = self.spec.model
        if load.mode == "fixed":
            phase("load: " + (f"concurrency {load.concurrency}" if load.concurrency else f"rate {load.rate}/s"
                              if load.rate else "the trace at its recorded times"))
            m = asyncio.run(run_load(url, model, self.workload, concurrency=load.concurrency, rate=load.rate,
                                     num_requests=load.num_requests, warmup=load.warmup, slo=self.slo,
                                     seed=self.spec.seed, endpoint=load.endpoint, tokenizer=self.tokenizer))
            return m, None

        def on_step(step: Any) -> None:
            at = f"{load.search} {step.load:g}"
            if load.search == "time_scale":   # [trace replay, issue 16] the load is the trace's speed-up
                at = f"x{step.load:g} the trace's rate (time_scale {1 / step.load:.3g})"
            if step.measurement.aborted_early:
                phase(f"capacity search: {at} -> SLO clearly broken, step cut short")
                return
            met = "meets SLO" if step.slo_met else "breaks SLO"
            phase(f"capacity search: {at} -> "
                  f"{step.measurement.metrics.get('output_throughput', 0):.0f} tok/s, {met}")

        phase(f"capacity search by {load.search}")
        cap: CapacityResult = asyncio.run(find_capacity(
            url, model, self.workload, self.slo, search=load.search, max_steps=load.max_steps,
            requests_per_step=load.requests_per_step, warmup=load.warmup, seed=self.spec.seed,
            tokenizer=self.tokenizer, on_step=on_step))
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
        return chosen, info

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
