"""The study loop: resume or create, clean up after a killed run, run the baseline first, then ask /
run / tell until the budget is spent. Optuna owns search state; the store owns evidence.

Interrupts are part of the design, not an afterthought: Ctrl-C, SIGTERM and the invocation's own
timeout stop the running trial's server, mark the trial FAIL (not counted) and enqueue its parameters
again, so the next `autotune run` redoes exactly that candidate.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import optuna
import psutil
from optuna.trial import TrialState

from autotune import causes
from autotune.engine.base import Engine
from autotune.engine.process import kill_leftovers
from autotune.space import SearchSpace, mapping_to_flags
from autotune.spec import StudySpec
from autotune.store.models import utcnow
from autotune.store.repository import ResultStore, sqlite_path
from autotune.telemetry import headroom_violation
from autotune.telemetry.base import TelemetrySource
from autotune.tuner.host import hardware
from autotune.tuner.objectives import (failure_constraints, measured_constraints, pick,
                                       placeholder_values)
from autotune.tuner.progress import Progress
from autotune.tuner.trial import TrialOutcome, TrialRunner, outcome_evidence

optuna.logging.set_verbosity(optuna.logging.WARNING)


class Interrupted(KeyboardInterrupt):
    """The invocation was stopped (signal or timeout); `reason` says which. A KeyboardInterrupt, so
    that no `except Exception` on the way (an HTTP client counting a failed request) can swallow it,
    and asyncio stops its loop at once instead of parking it in a task."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class StudyResult:
    complete: int
    feasible: int
    stopped_by: str | None    # None | "timeout" | "SIGINT" | "SIGTERM"


def make_sampler(spec: StudySpec, trials_so_far: int = 0) -> optuna.samplers.BaseSampler:
    """The seed moves on with the trials already in the study: a resumed run with the spec's fixed seed
    would otherwise replay the very candidates the killed run already measured."""
    seed = spec.seed + 7919 * trials_so_far
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if spec.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5)


def expected_trial_s(records: Sequence[Any]) -> float | None:
    """The median wall time of the trials that launched a server (measured or failed, not rejected by a
    constraint nor interrupted). A trial started with less time than that left before `--timeout` would
    most likely be cut off, wasting its startup and its slot: on a GPU host split into fixed-length
    sessions, or an overnight run that must end by morning, it is better to stop cleanly."""
    walls = sorted((r.finished_at - r.started_at).total_seconds() for r in records
                   if r.state in ("ok", "failed") and r.cause not in (causes.CONSTRAINT, causes.PREDICTED_OOM)
                   and r.finished_at is not None and r.started_at is not None)
    if not walls:
        return None
    mid = len(walls) // 2
    return walls[mid] if len(walls) % 2 else (walls[mid - 1] + walls[mid]) / 2


def log_dir_for(spec: StudySpec) -> Path:
    path = sqlite_path(spec.storage_url)
    base = path.parent if path is not None else Path("autotune-logs")
    return base / f"{spec.name}-logs"


class StudyLoop:
    def __init__(self, spec: StudySpec, space: SearchSpace, engine: Engine, telemetry: TelemetrySource,
                 n_trials: int, timeout_s: float | None, fixed_flags: Sequence[str], engine_command: list[str],
                 predict: Any = None, live: bool | None = None, started: float | None = None):
        self.spec = spec
        self.space = space
        self.engine = engine
        self.telemetry = telemetry
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.fixed_flags = list(fixed_flags)
        self.engine_command = engine_command
        self.predict = predict
        self.live = live
        self.started = time.monotonic() if started is None else started   # --timeout counts from here
        self.slo = spec.slo_obj
        self.headroom_constraint = spec.telemetry.require_headroom
        self._stop_reason: str | None = None

    # -- set-up -------------------------------------------------------------------------------------
    def _open(self) -> None:
        self.store = ResultStore(self.spec.storage_url)
        storage = optuna.storages.RDBStorage(self.spec.storage_url, engine_kwargs=(
            {"connect_args": {"timeout": 30}} if self.spec.storage_url.startswith("sqlite") else {}))
        self.study = optuna.create_study(study_name=self.spec.name, storage=storage, load_if_exists=True,
                                         directions=self.spec.directions())
        self.study.sampler = make_sampler(self.spec, len(self.study.get_trials(deepcopy=False)))
        if list(self.study.directions) != [optuna.study.StudyDirection.MAXIMIZE if d == "maximize" else
                                           optuna.study.StudyDirection.MINIMIZE for d in self.spec.directions()]:
            from autotune.errors import UserError
            raise UserError(f"study {self.spec.name!r} was created with other objectives; use a new study name")
        self.record = self.store.ensure_study(
            name=self.spec.name, model=self.spec.model, engine_kind=self.spec.engine.kind,
            engine_command=self.engine_command, fixed_flags=self.fixed_flags,
            space_hash=self.space.fingerprint(), spec_hash=self.spec.identity_hash(), spec=self.spec.public_dict(),
            objectives=[[o, d] for o, d in zip(self.spec.objectives, self.spec.directions())],
            slo=str(self.slo), quality_knobs=[p for p in self.space.quality_params])
        # [trace replay, issue 16] the workload's profile, stored with the study (tuner/workload_profile.py)
        from autotune.tuner.workload_profile import store_workload_profile
        store_workload_profile(self.store, self.record.id, self.spec)
        self.log_dir = log_dir_for(self.spec)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.hardware = hardware(self.spec)
        self.engine_version = self.engine.version()

    def _recover(self, progress: Progress) -> None:
        """After a SIGKILL: stop the servers the killed run left, and redo its unfinished trial."""
        leftovers = [p for p in self.store.processes(self.spec.name) if not psutil.pid_exists(p.owner_pid)
                     or p.owner_pid == os.getpid()]
        if leftovers:
            stopped = kill_leftovers([(p.pid, p.pgid, p.create_time) for p in leftovers])
            for p in leftovers:
                self.store.forget_process(p.id)
            progress.message(f"stopped {len(stopped)} server process(es) left by an earlier run")
        stale = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        for t in stale:
            self.study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            self._requeue(t.params, t.user_attrs.get("role", "search"), t.number)
        if stale:
            self.store.mark_abandoned(self.record.id, {t.number for t in stale})
            progress.message(f"re-queued {len(stale)} trial(s) interrupted by a killed run")

    def _ensure_baseline(self) -> None:
        """The baseline first, then the spec's `enqueue:` candidates not yet run (a resumed study picks
        up candidates added to the spec since)."""
        trials = self.study.get_trials(deepcopy=False)
        if not any(t.user_attrs.get("role") == "baseline" for t in trials):
            params = self.space.baseline_params()
            for k, v in (self.spec.baseline or {}).items():
                if k in self.space.params and self.space.params[k].contains(v):
                    params[k] = v
            self.study.enqueue_trial(params, user_attrs={"role": "baseline", "enqueued": sorted(params)})
        done = {t.user_attrs.get("spec_candidate") for t in trials}
        for extra in self.spec.enqueue:
            key = json.dumps(extra, sort_keys=True)
            if key not in done:
                self.study.enqueue_trial(extra, user_attrs={"role": "enqueued", "enqueued": sorted(extra),
                                                            "spec_candidate": key})

    def _requeue(self, params: dict[str, Any], role: str, number: int) -> None:
        self.study.enqueue_trial(params, user_attrs={"role": role, "enqueued": sorted(params),
                                                     "requeued_from": number})

    # -- the loop -----------------------------------------------------------------------------------
    def complete_count(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def run(self) -> StudyResult:
        self._open()
        with Progress(self.spec.name, self.spec.objectives, self.n_trials, live=self.live) as progress:
            self._recover(progress)
            self._ensure_baseline()
            self.runner = TrialRunner(self.spec, self.engine, self.telemetry, self.store, self.log_dir,
                                      self.fixed_flags, self.predict)
            deadline = None if self.timeout_s is None else self.started + self.timeout_s
            with _interrupts(self, deadline):
                try:
                    while self.complete_count() < self.n_trials:
                        if deadline is not None:
                            left = deadline - time.monotonic()
                            expected = expected_trial_s(self.store.trials(self.record.id)) or 0.0
                            if left <= 0 or left < expected:
                                if left > 0:
                                    progress.message(f"not starting another trial: one takes ~{expected:.0f} s "
                                                     f"and {left:.0f} s are left")
                                self._stop_reason = "timeout"
                                break
                        self._one(progress)
                except Interrupted as e:
                    self._stop_reason = e.reason
            self._keep_best_series()
        feasible = len(self.feasible_trials())
        return StudyResult(self.complete_count(), feasible, self._stop_reason)

    def _one(self, progress: Progress) -> None:
        trial = self.study.ask()
        role = trial.user_attrs.get("role", "search")
        # Enqueued trials (the baseline, re-queued ones) sample exactly their enqueued params, so what
        # Optuna records is what ran.
        enqueued = trial.user_attrs.get("enqueued")
        params = self.space.suggest(trial, only=enqueued)
        flags = mapping_to_flags(self.spec.baseline or {}) if role == "baseline" else self.space.render(params)
        violations = self.space.violations(params, self.fixed_flags, self.spec.num_gpus) if role != "baseline" else []
        progress.trial_started(trial.number, role, self.complete_count(), flags)
        started = utcnow()
        stamp = dict(optuna_trial_id=trial._trial_id, role=role, params=params, flags=flags,
                     engine_version=self.engine_version, hardware=self.hardware, workload=self.spec.workload,
                     spec_hash=self.spec.identity_hash(), started_at=started)
        self.store.save_trial(self.record.id, trial.number, state="running", **stamp)
        try:
            outcome = self.runner.run(trial.number, flags, violations, progress.phase)
        except Interrupted as e:
            self.study.tell(trial, state=TrialState.FAIL)
            self._requeue(params, role, trial.number)
            self.store.save_trial(self.record.id, trial.number, state="interrupted", cause=causes.INTERRUPTED,
                                  detail=f"stopped by {e.reason}; parameters re-queued", finished_at=utcnow())
            progress.trial_finished(trial.number, role, "interrupted", None, e.reason)
            raise
        self._tell(trial, role, outcome, progress)

    def _tell(self, trial: optuna.Trial, role: str, outcome: TrialOutcome, progress: Progress) -> None:
        headroom_value = None
        if outcome.telemetry is not None:
            headroom_value = headroom_violation(outcome.telemetry, self.spec.telemetry.headroom_margin)
        values = pick(self.spec.objectives, outcome.observed) if outcome.state != "failed" else None
        if outcome.state == "failed" or values is None:
            if outcome.state != "failed":
                outcome.state, outcome.cause = "failed", outcome.cause or causes.CRASH
                outcome.detail = outcome.detail or "an objective could not be measured"
            constraints = failure_constraints(self.slo, self.headroom_constraint)
            history = [t.values for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                       if t.user_attrs.get("measured")]
            told = placeholder_values(self.spec.objectives, history)
        else:
            constraints = measured_constraints(self.slo, outcome.metrics, headroom_value, self.headroom_constraint)
            told = values
            feasible = all(v <= 0 for v in constraints.values())
            if not feasible:
                outcome.state = "infeasible"
            trial.set_user_attr("measured", True)
        for key, value in constraints.items():
            trial.set_constraint(key, float(value) if math.isfinite(value) else 1e9)
        trial.set_user_attr("cause", outcome.cause)
        self.study.tell(trial, told)
        evidence = outcome_evidence(outcome)
        if outcome.startup is not None and outcome.startup.engine_version:
            # The API server has no --version: its version is known once one launch has logged its banner.
            self.engine_version = outcome.startup.engine_version
        evidence["engine_version"] = self.engine_version
        measured = dict(zip(self.spec.objectives, values)) if values is not None else {}
        self.store.save_trial(self.record.id, trial.number, objectives=measured, constraints=constraints,
                              finished_at=utcnow(), **evidence)
        if outcome.measurement is not None:
            rec = self.store.trial(self.record.id, trial.number)
            assert rec is not None
            self.store.add_series(rec.id, "requests", outcome.measurement.to_json()["requests"])
            if outcome.telemetry is not None and outcome.telemetry.series:
                from autotune.telemetry import series_for_store
                self.store.add_series(rec.id, "telemetry", series_for_store(outcome.telemetry))
        note = outcome.cause or ""
        if outcome.state == "infeasible":
            broken = [k for k, v in constraints.items() if v > 0]
            note = "breaks " + ", ".join(broken) + (f" ({outcome.cause})" if outcome.cause else "")
        progress.trial_finished(trial.number, role, outcome.state, measured or None, note)

    # -- results ------------------------------------------------------------------------------------
    def feasible_trials(self) -> list[optuna.trial.FrozenTrial]:
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("measured") and all(v <= 0 for v in t.constraints.values()):
                out.append(t)
        return out

    def _keep_best_series(self) -> None:
        """Raw series are kept for the best few trials only, so the DB stays small overnight."""
        best = sorted(self.feasible_trials(), key=lambda t: -t.values[0]
                      if self.spec.directions()[0] == "maximize" else t.values[0])[: self.spec.keep_series]
        keep = {rec.id for rec in self.store.trials(self.record.id) if rec.number in {t.number for t in best}}
        self.store.keep_series_only_for(self.record.id, keep)


class _interrupts:
    """Turn SIGINT, SIGTERM and the deadline into `Interrupted` in the main thread."""

    def __init__(self, loop: StudyLoop, deadline: float | None):
        self.loop = loop
        self.deadline = deadline
        self.reason: str | None = None
        self._timer: threading.Timer | None = None

    def _raise(self, reason: str) -> None:
        self.reason = reason
        raise Interrupted(reason)

    def __enter__(self) -> "_interrupts":
        self._old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGINT, lambda *_: self._raise("SIGINT"))
        signal.signal(signal.SIGTERM, lambda *_: self._raise("SIGTERM"))
        if self.deadline is not None:
            self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()),
                                          lambda: os.kill(os.getpid(), signal.SIGUSR1))
            signal.signal(signal.SIGUSR1, lambda *_: self._raise("timeout"))
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        for s, h in self._old.items():
            signal.signal(s, h)
