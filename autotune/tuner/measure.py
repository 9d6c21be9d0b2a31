"""A trial's measurement, run in its own process (node/worker.py): the telemetry sampler and the load
client (one fixed load, or the capacity search), and the messages that carry it.

The job thread (tuner/trial.py) starts the server and, once it answers, sends a `MeasureRequest`; the
worker answers with `PhaseLine`s (the same phase texts `run` always printed) and one final message:
`Measured` (the measurement with its request records, the search's record, the telemetry summary, the
worker's own CPU use), `Stopped` (asked to stop before the measurement completed) or `Failed` (a bug).

A stop cuts a running load step at once; between steps the search stops before the next one starts.
A search that has returned is complete: its `Measured` is sent whatever arrives after, so an interrupt
after a trial's last step never throws its measurement away (issue 22).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from contextlib import nullcontext
from dataclasses import asdict
from typing import Any, Callable, Literal, Sequence

from pydantic import BaseModel

# What the worker runs, imported when it boots (beside the server's start), not after the request came:
from autotune.bench import find_capacity, parse_workload, run_load
from autotune.bench import measurement_flags as mflags
from autotune.bench.client import stalled_requests
from autotune.bench.metrics import capacity_tps
from autotune.bench.results import LoadStep
from autotune.bench.step_bounds import ServerLimits
from autotune.engine.logwatch import JitWatch
from autotune.errors import UserError
from autotune.node.interrupts import Gate, Interrupted, current_gate, interruptible, run_async, set_gate
from autotune.node.worker import Channel, Worker
from autotune.slo import SLO
from autotune.spec import LoadSpec
from autotune.telemetry import get_source
from autotune.telemetry.base import TelemetryTarget
from autotune.tuner.earlystop import EarlyStop

TARGET = "autotune.tuner.measure:serve"
STOP_ANSWER_S = 15.0      # a worker told to stop answers at once, or at the latest when its step ends
POLL_S = 0.2

Phase = Callable[[str], None]


def step_tps(metrics: dict[str, float]) -> str:
    """A load step's tok/s as the progress line gives it: the figure capacity_tps takes (the fully-loaded
    window), and the whole step's average beside it where the drain moved that by more than 5 %. On
    fixed-length answers just above max-num-seqs the whole step read 12-20 % lower (benchmarks/gpu/knobs,
    session 26), and printed alone it looked like a loss that no objective had."""
    tps, whole = capacity_tps(metrics) or 0.0, metrics.get("output_throughput") or 0.0
    also = f" ({whole:.0f} over the whole step)" if whole and abs(tps / whole - 1) > 0.05 else ""
    return f"{tps:.0f} tok/s{also}"


class TelemetryRequest(BaseModel):
    source: str                  # telemetry/__init__.get_source's name
    hz: float
    server_pid: int | None = None
    gpus: list[int] = []
    server_url: str | None = None


class EarlyStopRequest(BaseModel):
    """tuner/earlystop.EarlyStop's arguments: the front as it was when the trial started."""

    objectives: list[str]
    directions: list[str]
    front: list[list[float]]
    integer: bool = True
    num_gpus: int = 1


class MeasureRequest(BaseModel):
    kind: Literal["measure"] = "measure"
    url: str
    model: str
    workload: dict[str, Any]     # the spec's workload section
    slo: str
    load: dict[str, Any]         # the spec's load section (spec.LoadSpec)
    seed: int
    tokenizer: str | None = None
    api_key: str | None = None   # over the pipe only: never logged, never stored
    hint: tuple[float, float | None] | None = None
    claim: float | None = None
    early_stop: EarlyStopRequest | None = None
    log_path: str                # the server's log, for the JIT watch (engine/logwatch.py)
    more_logs: list[str] = []    # a PD deployment's instance logs, watched too
    limits: dict[str, int | None] | None = None   # bench.step_bounds.ServerLimits: what bounds a step's growth
    telemetry: TelemetryRequest


class PhaseLine(BaseModel):
    kind: Literal["phase"] = "phase"
    text: str


class ClientUse(BaseModel):
    """What the load client (the worker process) cost: CPU seconds of its process over the measurement."""

    pid: int
    cpu_s: float
    wall_s: float
    cores: list[int] = []

    @property
    def cpu_share(self) -> float:
        """Of one core: 1.0 = the client used a whole core for the whole measurement."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**self.model_dump(), "cpu_share": round(self.cpu_share, 4)}


class Measured(BaseModel):
    kind: Literal["measured"] = "measured"
    measurement: dict[str, Any] | None = None   # dataclasses.asdict(bench.results.Measurement)
    capacity: dict[str, Any] | None = None      # the capacity search's record (None for a fixed load)
    stalled: int = 0                            # requests the server stopped answering mid-stream
    telemetry: dict[str, Any]                   # dataclasses.asdict(telemetry.base.TelemetrySummary)
    elapsed_s: float
    bound: dict[str, float] | None = None       # the early-stop bound when the search was stopped early
    error: str | None = None                    # the load's UserError (e.g. every request stalled)
    client: ClientUse


class Stopped(BaseModel):
    kind: Literal["stopped"] = "stopped"
    reason: str


class Failed(BaseModel):
    kind: Literal["failed"] = "failed"
    error: str                                  # the worker's traceback


# -- the job thread's side ----------------------------------------------------------------------------
def measure(worker: Worker, request: MeasureRequest, phase: Phase) -> Measured:
    """Send the request and wait for the worker's answer, passing its phase lines on. An interrupt of
    this thread's gate tells the worker to stop; its `Stopped` then raises Interrupted here. A `Measured`
    settles the gate: the measurement is kept whatever interrupt comes after. Raises WorkerDied when the
    worker ends without answering, RuntimeError when it failed."""
    gate = current_gate()
    worker.send(request)
    asked: float | None = None
    with gate.cancelling(worker.request_stop) if gate is not None else nullcontext():
        while True:
            msg = worker.poll(POLL_S)
            if msg is None:
                if worker.stop_sent:
                    asked = asked or time.monotonic()
                    if time.monotonic() - asked > STOP_ANSWER_S:     # it does not answer: end it
                        worker.close(grace_s=0)
                        raise Interrupted(gate.reason if gate is not None and gate.reason else "stop")
                continue
            kind = msg.get("kind")
            if kind == "phase":
                phase(msg["text"])
            elif kind == "measured":
                if gate is not None:
                    gate.settle()
                return Measured.model_validate(msg)
            elif kind == "stopped":
                raise Interrupted(gate.reason if gate is not None and gate.reason else msg["reason"])
            elif kind == "failed":
                raise RuntimeError(f"the measurement worker failed:\n{msg.get('error')}")


# -- the worker's side ----------------------------------------------------------------------------------
def serve(channel: Channel) -> None:
    """The worker process's main (node/worker.py): one request, one final answer."""
    try:
        first = channel.recv()
    except (EOFError, OSError):
        return                                  # the parent closed before asking for anything
    if first.get("kind") != "measure":
        channel.send(Stopped(reason=str(first.get("reason") or "stop")))
        return
    run = _Run(MeasureRequest.model_validate(first), channel)
    threading.Thread(target=run.listen, name="stop-listener", daemon=True).start()
    try:
        answer: BaseModel = run.measure()
    except Interrupted as e:
        answer = Stopped(reason=e.reason)
    except Exception:
        answer = Failed(error=traceback.format_exc())
    channel.send(answer)


class _Run:
    """One measurement in the worker, and when a stop may cut it: at once while a load step runs,
    else before the next step begins (or never, once the search has returned)."""

    def __init__(self, request: MeasureRequest, channel: Channel) -> None:
        self.request, self.channel = request, channel
        self.gate = Gate()
        self._lock = threading.Lock()
        self.busy = True                # a load step (or the fixed load) is running
        self.stop_reason: str | None = None
        self.cut = False                # the search ended because of the stop, not on its own

    def listen(self) -> None:
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError):
                self.request_stop("the parent closed the pipe")
                return
            if msg.get("kind") == "stop":
                self.request_stop(str(msg.get("reason") or "stop"))

    def request_stop(self, reason: str) -> None:
        with self._lock:
            self.stop_reason = self.stop_reason or reason
            busy = self.busy
        if busy:
            self.gate.interrupt(reason)

    def step_ended(self) -> None:
        with self._lock:
            self.busy = False

    def step_begins(self) -> None:
        with self._lock:
            self.busy = True
            reason = self.stop_reason
        if reason is not None:
            self.gate.interrupt(reason)         # cancels the step at its first await

    def should_stop(self, stopper: Any) -> Callable[[Sequence[Any]], bool]:
        def check(steps: Sequence[Any]) -> bool:
            if stopper is not None and stopper.should_stop(steps):
                return True                     # early stopping: a complete measurement of its own kind
            with self._lock:
                if self.stop_reason is not None:
                    self.cut = True
                    return True
            return False
        return check

    def phase(self, text: str) -> None:
        self.channel.send(PhaseLine(text=text))

    def measure(self) -> Measured:
        req = self.request
        t = req.telemetry
        sampler = get_source(t.source).sampler(TelemetryTarget(server_pid=t.server_pid, gpus=list(t.gpus),
                                                               server_url=t.server_url), hz=t.hz)
        cpu0 = time.process_time()
        sampler.start()
        t0 = time.monotonic()
        measurement, capacity, stalled, error, bound = None, None, 0, None, None
        set_gate(self.gate)
        try:
            with interruptible():
                measurement, capacity, stalled, bound = self._load()
        except UserError as e:
            error = str(e)
        finally:
            set_gate(None)
            summary = sampler.stop()
        elapsed = time.monotonic() - t0
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        return Measured(measurement=asdict(measurement) if measurement is not None else None, capacity=capacity,
                        stalled=stalled, telemetry=asdict(summary), elapsed_s=elapsed, bound=bound, error=error,
                        client=ClientUse(pid=os.getpid(), cpu_s=time.process_time() - cpu0, wall_s=elapsed,
                                         cores=cores))

    def _load(self) -> tuple[Any, dict[str, Any] | None, int, dict[str, float] | None]:
        """(measurement, the search's record, stalled requests, early-stop bound): the load as the trial
        runner ran it in its own thread before (same phase texts, same record)."""
        req = self.request
        load, workload, slo = LoadSpec(**req.load), parse_workload(req.workload), SLO.parse(req.slo)
        if load.mode == "fixed":
            self.phase("load: " + (f"concurrency {load.concurrency}" if load.concurrency else f"rate {load.rate}/s"
                                   if load.rate else "the trace at its recorded times"))

            async def fixed() -> Any:
                m = await run_load(req.url, req.model, workload, concurrency=load.concurrency, rate=load.rate,
                                   num_requests=load.num_requests, warmup=load.warmup, slo=slo, seed=req.seed,
                                   endpoint=load.endpoint, tokenizer=req.tokenizer,
                                   stall_timeout_s=load.stall_timeout_s, api_key=req.api_key)
                self.step_ended()       # inside the loop: a stop from here on is noted, not delivered
                return m
            m = run_async(fixed())
            m.flags = mflags.merge([mflags.CLIENT_SATURATED] if m.client.saturated else [],
                                   [mflags.PREFIX_HITS] if mflags.prefix_flattered(
                                       m.metrics.get("prefix_cache_hit_pct"), workload.kind) else [])
            return m, None, stalled_requests(m.records), None

        stopper = EarlyStop(**req.early_stop.model_dump()) if req.early_stop is not None else None

        def on_step(step: Any) -> None:
            self.step_ended()
            at = f"{load.search} {step.load:g}"
            if load.search == "time_scale":   # [trace replay, issue 16] the load is the trace's speed-up
                at = f"x{step.load:g} the trace's rate (time_scale {1 / step.load:.3g})"
            if step.disturbances:
                self.phase(f"capacity search: {at} -> {step.disturbances[0]}; re-ran it"
                           + (f", and again during the re-run ({mflags.JIT_COMPILE})"
                              if len(step.disturbances) > 1 else ""))
            if step.measurement.aborted_early:
                why = step.measurement.load.get("abort_reason")
                self.phase(f"capacity search: {at} -> SLO clearly broken" + (f" ({why})" if why else "")
                           + ", step cut short")
                return
            met = "meets SLO" if step.slo_met else "breaks SLO"
            self.phase(f"capacity search: {at} -> {step_tps(step.measurement.metrics)}, {met}")

        hint = tuple(req.hint) if req.hint else None
        self.phase(f"capacity search by {load.search}" + (f", starting near the study's {hint[0]:g}" if hint else ""))
        cap = run_async(find_capacity(
            req.url, req.model, workload, slo, search=load.search, max_steps=load.max_steps,
            requests_per_step=load.requests_per_step, warmup=load.warmup, seed=req.seed, endpoint=load.endpoint,
            tokenizer=req.tokenizer, on_step=on_step, min_waves=load.min_waves, min_step_s=load.min_step_s,
            max_bracket=load.max_bracket, refine_steps=load.refine_steps, stall_timeout_s=load.stall_timeout_s,
            api_key=req.api_key, should_stop=self.should_stop(stopper),
            step_watch=_Watch(JitWatch(req.log_path, req.more_logs), self), check=req.claim, hint=hint,
            limits=ServerLimits(**req.limits) if req.limits is not None else None))
        if self.cut:                    # stopped between steps: an unfinished search is no measurement
            raise Interrupted(self.stop_reason or "stop")
        chosen = cap.at_capacity or (cap.steps[0].measurement if cap.steps else None)
        info = {"mode": cap.mode, "capacity": cap.capacity, "hint": list(hint) if hint else None,
                "cache_reset": cap.cache_reset, "note": cap.note,
                "bracket": list(cap.bracket), "measurement_flags": list(cap.flags), "seed": req.seed,
                "steps": [step_record(s) for s in cap.steps]}
        stalled = sum(stalled_requests(s.measurement.records) for s in cap.steps)
        return chosen, info, stalled, (stopper.bound if stopper is not None and stopper.stopped else None)


class _Watch:
    """The search's step watch (a JIT compile during a step), which also marks where each step begins:
    a stop that arrived between steps cuts the next one before its first request."""

    def __init__(self, inner: Any, run: _Run) -> None:
        self.inner, self.run = inner, run

    def begin(self) -> None:
        self.run.step_begins()
        self.inner.begin()

    def disturbed(self) -> str | None:
        return self.inner.disturbed()


# A step's figures per request class, kept with the step where its requests carried images (the SLO may
# bound each class apart, and `show`/the report read which class broke it).
_CLASS_KEYS = ("images_per_s", "image_completed", "text_completed", "image_median_ttft_ms", "image_p99_ttft_ms",
               "text_median_ttft_ms", "text_p99_ttft_ms")


def step_record(s: LoadStep) -> dict[str, Any]:
    """One load step as the trial's capacity record keeps it: enough to tell afterwards why a search ended
    where it did. A step cut short keeps which SLO term ended it and how (`abort_reason`): on a knife-edge
    bound the first run and a repeat can part on a handful of requests, and the reason says which."""
    m = s.measurement.metrics
    return {"load": s.load, "slo_met": s.slo_met, "first_wave": s.measurement.first_wave_summary(),
            "prefix_cache_hit_pct": m.get("prefix_cache_hit_pct"), "output_throughput": m.get("output_throughput"),
            "steady_output_throughput": m.get("steady_output_throughput"), "p99_ttft_ms": m.get("p99_ttft_ms"),
            "median_tpot_ms": m.get("median_tpot_ms"), "p99_tpot_ms": m.get("p99_tpot_ms"),
            "completed": m.get("completed"), "total_output_tokens": m.get("total_output_tokens"),
            "failed": m.get("failed"), "aborted_early": s.measurement.aborted_early,
            "abort_reason": s.measurement.load.get("abort_reason"), "disturbances": list(s.disturbances),
            # which step's client fell behind, not only that one did (the result's flag)
            "client_saturated": s.measurement.client.saturated,
            "client_lag_p99_ms": s.measurement.client.loop_lag_p99_ms,
            "client_note": s.measurement.client.note,      # its lag, CPU and collections
            "discarded_output_tokens": (s.discarded.metrics.get("total_output_tokens")
                                        if s.discarded is not None else None),
            **_class_figures(m)}


def _class_figures(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: metrics[k] for k in _CLASS_KEYS if k in metrics}


__all__ = ["ClientUse", "EarlyStopRequest", "Failed", "MeasureRequest", "Measured", "PhaseLine", "Stopped",
           "TARGET", "TelemetryRequest", "measure", "serve"]
