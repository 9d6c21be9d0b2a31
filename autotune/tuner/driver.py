"""One study's side of the scheduler: ask (with the running trials known), suggest, free checks, tell,
evidence. Many trials of one study may run at once, in threads of this process and in other processes
or hosts sharing the storage, so every decision here reads the shared database, not local state.

Extension points for other parts of the tuner (docs/SCHEDULER.md, "Hooks"):
- `before_launch`: checks run on a candidate after the free checks and before it gets GPUs; the first
  that returns a TrialOutcome rejects it (told as failed, never launched).
- `after_tell`: steps run after every trial is told (e.g. a warm start once the baseline is in).
- `after_budget`: steps run once when the study reaches its trials (the confirmation of the winner,
  the daemon's report), as jobs of the scheduler (tuner/budget.py): in job threads holding leases,
  interruptible like trials, a step's parts (the confirmation's rounds) at once when slots are free; the
  driver is closed after they end.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError

from autotune import causes
from autotune.bench.measurement_flags import OVERLAPPED
from autotune.node.heartbeat import Heartbeats
from autotune.node.pool import Lease, host_name
from autotune.engine.base import Engine
from autotune.engine.process import kill_leftovers
from autotune.errors import UserError
from autotune.flags import flags_to_mapping, with_env
from autotune.space import SearchSpace, mapping_to_flags
from autotune.spec import StudySpec
from autotune.store.models import utcnow
from autotune.store.queries import wall_s
from autotune.store.reconnect import wait_to_connect
from autotune.store.repository import ResultStore, sqlite_path
from autotune.telemetry import headroom_violation
from autotune.telemetry.base import TelemetrySource
from autotune.tuner.host import hardware
from autotune.tuner.objectives import (failure_constraints, measured_constraints, pick,
                                       placeholder_values)
from autotune.tuner import search_hooks
from autotune.tuner.policy import counted
from autotune.tuner.progress import Progress
from autotune.tuner.sharing import (ask_baseline_first, claim, dead_owner_servers, first_to_create, gpu_model,
                                    identity_conflict, make_sampler, missed_by, overlapping)
from autotune.tuner.budget import AfterBudget, BudgetStep
from autotune.tuner.trial import Phase, TrialOutcome, TrialRunner, outcome_evidence
from autotune.tuner.workload_profile import store_workload_profile

optuna.logging.set_verbosity(optuna.logging.WARNING)

_LOST_RACE = (UpdateFinishedTrialError, OperationalError, RuntimeError)


@dataclass
class StudyResult:
    complete: int
    feasible: int
    stopped_by: str | None    # None | "timeout" | "SIGINT" | "SIGTERM"


@dataclass
class TrialJob:
    study: str
    number: int               # Optuna trial.number
    trial_id: int             # Optuna _trial_id
    role: str                 # baseline | search | enqueued | confirm
    params: dict[str, Any]
    flags: list[str]          # rendered candidate flags
    n_gpus: int               # TP x PP x DP of the candidate (1 on CPU/sim single-GPU)
    exclusive: bool
    violations: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)   # what the candidate's env knobs set at launch
    started_at: dt.datetime | None = None
    trial: optuna.Trial | None = field(default=None, repr=False)


LaunchCheck = Callable[["StudyDriver", TrialJob], "TrialOutcome | None"]
TellHook = Callable[["StudyDriver", TrialJob, TrialOutcome], None]


def expected_trial_s(records: Sequence[Any]) -> float | None:
    """The median wall time of the trials that launched a server (measured or failed, not rejected by a
    constraint nor interrupted). A trial started with less time than that left before `--timeout` would
    most likely be cut off, wasting its startup and its slot: on a GPU host split into fixed-length
    sessions, or an overnight run that must end by morning, it is better to stop cleanly."""
    walls = [w for r in records if r.state in ("ok", "failed")
             and r.cause not in (causes.CONSTRAINT, causes.PREDICTED_OOM, causes.WORKER_DIED)
             and (w := wall_s(r)) is not None]
    return statistics.median(walls) if walls else None


def log_dir_for(spec: StudySpec) -> Path:
    path = sqlite_path(spec.storage_url)
    base = path.parent if path is not None else Path("autotune-logs")
    return base / f"{spec.name}-logs"


def layout_gpus(flags: Sequence[str]) -> int:
    """TP x PP x DP of a launch (fixed flags and the candidate's, later ones win), times its engine
    instances for a PD layout (pdlayout.py)."""
    from autotune.pdlayout import gpus_of

    return gpus_of(flags_to_mapping(flags))


class StudyDriver:
    """One study in one process. `next_job`/`finish`/`interrupt` may be called from several threads."""

    def __init__(self, spec: StudySpec, space: SearchSpace, engine: Engine, telemetry: TelemetrySource,
                 n_trials: int, timeout_s: float | None, fixed_flags: Sequence[str], engine_command: list[str],
                 predict: Any = None, live: bool | None = None, started: float | None = None, *,
                 progress: Progress | None = None, heartbeats: Heartbeats | None = None,
                 host: str | None = None, log_dir: Path | None = None, notices: Sequence[str] = ()) -> None:
        self.spec = spec
        self.name = spec.name
        self.space = space
        self.engine = engine
        self.telemetry = telemetry
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.fixed_flags = list(fixed_flags)
        self.engine_command = engine_command
        self.predict = predict
        self.started = time.monotonic() if started is None else started   # --timeout counts from here
        self.deadline = None if timeout_s is None else self.started + timeout_s
        self.slo = spec.slo_obj
        self.headroom_constraint = spec.telemetry.require_headroom
        self.host = host or host_name()
        self.log_dir = log_dir or log_dir_for(spec)    # trial logs (the daemon: one folder per host and study)
        self.progress = progress or Progress(spec.name, spec.objectives, n_trials, live=live)
        self.heartbeats = heartbeats
        self.notices = list(notices)      # one line each: knobs this engine lacks, dropped before the study
        self.tag_phases = False           # prefix phase lines with the trial (set when trials overlap)
        self.stop_reason: str | None = None
        self.cancelled = False
        self.spent = False                # the search space has nothing new left (search_hooks.spent)
        self.twin: Any = None             # set by search_hooks.open_policy
        self.warm: Any = None             # search_hooks.WarmStart while the twin ranks beside the baseline
        self.before_launch: list[LaunchCheck] = []
        self.after_tell: list[TellHook] = []
        self.after_budget: list[BudgetStep] = []
        self.after_budget_started = False     # the scheduler took an after-budget job
        self.after_budget_finished = False    # ended for good: every step returned, or an error was logged
        #                                       (not when interrupted: the next run continues them)
        self._budget = AfterBudget(self)      # its steps' parts as they are handed out (tuner/budget.py)
        self._running: dict[int, TrialJob] = {}
        self._lock = threading.RLock()
        self._own_heartbeats = False
        self._opened = False

    # -- set-up -------------------------------------------------------------------------------------
    def open(self) -> None:
        """Create or load the study, check this host may join it, recover stale trials, enqueue the
        baseline and the spec's candidates (once across processes)."""
        self.store = first_to_create(lambda: ResultStore(self.spec.storage_url))
        storage = first_to_create(lambda: optuna.storages.RDBStorage(self.spec.storage_url, engine_kwargs=(
            {"connect_args": {"timeout": 30}} if self.spec.storage_url.startswith("sqlite")
            else {"pool_pre_ping": True})))
        wait_to_connect(storage.engine)   # a trial's tell waits out a database restart (store/reconnect.py)
        self.study = optuna.create_study(study_name=self.spec.name, storage=storage, load_if_exists=True,
                                         directions=self.spec.directions())
        if list(self.study.directions) != [optuna.study.StudyDirection.MAXIMIZE if d == "maximize" else
                                           optuna.study.StudyDirection.MINIMIZE for d in self.spec.directions()]:
            raise UserError(f"study {self.spec.name!r} was created with other objectives; use a new study name")
        self.study.sampler = make_sampler(self.spec, len(self.study.get_trials(deepcopy=False)), self.host)
        self.record = self.store.ensure_study(
            name=self.spec.name, model=self.spec.model, engine_kind=self.spec.engine.kind,
            engine_command=self.engine_command, fixed_flags=self.fixed_flags,
            space_hash=self.space.fingerprint(), spec_hash=self.spec.identity_hash(), spec=self.spec.public_dict(),
            objectives=[[o, d] for o, d in zip(self.spec.objectives, self.spec.directions())],
            slo=str(self.slo), quality_knobs=[p for p in self.space.quality_params])
        store_workload_profile(self.store, self.record.id, self.spec)   # what traffic the numbers are under
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.hardware = hardware(self.spec)
        self.engine_version = self.engine.version()
        self.identity = {"gpu_model": gpu_model(self.hardware), "engine_version": self.engine_version,
                         "spec": self.spec.join_hash()}
        self.check_identity()
        if self.heartbeats is None:
            self.heartbeats = Heartbeats(self.store.engine, host=self.host).start()
            self._own_heartbeats = True
        self.progress.__enter__()
        for line in self.notices:
            self.progress.message(line)
        self._opened = True
        self.recover()
        search_hooks.open_policy(self)   # dedupe, learned limits, early stop, the twin (tuner/search_hooks.py)
        self._ensure_enqueued()
        self.runner = TrialRunner(self.spec, self.engine, self.telemetry, self.store, self.log_dir,
                                  self.fixed_flags, self.predict)

    def check_identity(self) -> None:
        """A host whose GPU model, engine version or spec differs from the study's first trials would
        mix incomparable measurements into one search: refuse it with one line."""
        conflict = identity_conflict(self.store.trials(self.record.id), self.identity)
        if conflict:
            raise UserError(f"study {self.spec.name!r}: {conflict}; use a new study name")

    def recover(self) -> None:
        """Fail and re-queue trials whose owner stopped beating, and stop servers left on this host by
        a dead owner. Called at open and periodically by the scheduler."""
        self._stop_leftovers()
        with self._lock:
            mine = {j.trial_id for j in self._running.values()}
        running = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t._trial_id not in mine]
        assert self.heartbeats is not None
        stale = self.heartbeats.stale(str(t._trial_id) for t in running)
        requeued = []
        told = []
        for t in running:
            if str(t._trial_id) not in stale:
                continue
            rec = self.store.trial(self.record.id, t.number)
            if rec is not None and self._tell_from_evidence(t, rec):
                told.append(t.number)
                self.heartbeats.forget("trial", str(t._trial_id))
                continue
            try:
                self.study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except _LOST_RACE:
                pass                        # another process failed it first
            if self.claim(f"requeue:{t.number}"):
                self._requeue(t.params, t.user_attrs.get("role", "search"), t.number)
                if rec is None:
                    self._record_unlaunched(t)
                else:
                    self.store.mark_abandoned(self.record.id, {t.number})
                requeued.append(t.number)
            self.heartbeats.forget("trial", str(t._trial_id))
        if requeued:
            self.progress.message(f"re-queued trial(s) {', '.join(map(str, requeued))}: their process "
                                  f"stopped beating (killed or cut off)")
        if told:
            self.progress.message(f"told trial(s) {', '.join(map(str, told))} from their saved evidence: their "
                                  f"process stopped beating after measuring them")

    def _record_unlaunched(self, t: optuna.trial.FrozenTrial) -> None:
        """A process killed between Optuna's ask and its first write of the trial leaves no row: write one,
        so that the table accounts for every number Optuna handed out (nothing ran: no flags). Its host is
        the one its heartbeat names (the owner beats a trial as soon as it asks for it)."""
        assert self.heartbeats is not None
        beat = self.heartbeats.ages("trial", [str(t._trial_id)]).get(str(t._trial_id))
        self.store.save_trial(self.record.id, t.number, state="interrupted", cause=causes.INTERRUPTED,
                              detail="its process stopped before the trial was launched; parameters re-queued",
                              optuna_trial_id=t._trial_id, role=t.user_attrs.get("role", "search"),
                              params=dict(t.params), flags=[], spec_hash=self.spec.identity_hash(),
                              started_at=t.datetime_start or utcnow(), finished_at=utcnow(),
                              host=beat.host if beat is not None else None)

    def _tell_from_evidence(self, t: optuna.trial.FrozenTrial, rec: Any) -> bool:
        """A process killed between saving a trial's evidence and telling Optuna (two writes) leaves a
        measured trial RUNNING. Re-running it would cost a launch and leave two verdicts on one number
        (our table 'ok', Optuna FAIL): tell Optuna what the evidence says instead. Only a finished row
        whose told values can be rebuilt qualifies (an early-stopped trial's bound is not stored); the
        search hooks that follow a tell (learned limits) do not run for it."""
        if rec.state not in ("ok", "infeasible", "failed"):
            return False
        if rec.state == "failed":
            values = self._placeholders()
        elif all(name in (rec.objectives or {}) for name in self.spec.objectives):
            values = [float(rec.objectives[name]) for name in self.spec.objectives]
        else:
            return False
        try:
            self._tell_optuna(optuna.trial.Trial(self.study, t._trial_id), rec.constraints or {}, rec.cause, values)
        except _LOST_RACE:
            pass                            # another process told or failed it first, by this same rule
        return True

    def _placeholders(self) -> list[float]:
        """What Optuna is told for a trial that measured nothing: the worst of the measured ones."""
        history = [t.values for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("measured")]
        return placeholder_values(self.spec.objectives, history)

    def _tell_optuna(self, trial: optuna.trial.Trial, constraints: dict[str, float], cause: str | None,
                     values: Sequence[float]) -> None:
        for key, value in constraints.items():
            trial.set_constraint(key, float(value) if math.isfinite(value) else 1e9)
        trial.set_user_attr("cause", cause)
        self.study.tell(trial, values)

    def _stop_leftovers(self) -> None:
        leftovers = dead_owner_servers(list(self.store.processes(self.spec.name)), self.host, bool(self._running))
        if leftovers:
            stopped = kill_leftovers([(p.pid, p.pgid, p.create_time) for p in leftovers])
            for p in leftovers:
                self.store.forget_process(p.id)
            self.progress.message(f"stopped {len(stopped)} server process(es) left by an earlier run")

    def claim(self, key: str) -> bool:
        """Insert (study, key) into autotune_enqueued; True for the one process that inserted it."""
        return claim(self.store.engine, self.spec.name, key, self.host)

    def _ensure_enqueued(self) -> None:
        """The baseline first, then the spec's `enqueue:` candidates not yet run (a resumed study picks
        up candidates added to the spec since), each enqueued once across processes."""
        trials = self.study.get_trials(deepcopy=False)
        has_baseline = any(t.user_attrs.get("role") == "baseline" for t in trials)
        if self.claim("baseline") and not has_baseline:
            params = self.space.baseline_params()
            outside = []
            for k, v in (self.spec.baseline or {}).items():
                if k not in self.space.params:
                    continue
                value = self.space.params[k].coerce(v)
                if self.space.params[k].contains(value):
                    params[k] = value
                else:
                    outside.append(f"{k}={v}")
            if outside:     # launched as given (its flags are the spec's), but Optuna cannot record it
                self.progress.message(f"baseline: {', '.join(outside)} outside the search space: launched as "
                                      f"given; the sampler records the space's default in its place")
            self.study.enqueue_trial(params, user_attrs={"role": "baseline", "enqueued": sorted(params)})
        done = {t.user_attrs.get("spec_candidate") for t in trials}
        for extra in self.spec.enqueue:
            key = json.dumps(extra, sort_keys=True)
            if key not in done and self.claim(f"spec:{key}"):
                self.study.enqueue_trial(extra, user_attrs={"role": "enqueued", "enqueued": sorted(extra),
                                                            "spec_candidate": key})
        if self.twin is not None and self.claim("warm_start"):
            self.warm = search_hooks.warm_start(self, self.progress)   # the twin's picks, once per study

    def _requeue(self, params: dict[str, Any], role: str, number: int, **attrs: Any) -> None:
        self.study.enqueue_trial(params, user_attrs={"role": role, "enqueued": sorted(params),
                                                     "requeued_from": number, **attrs})

    # -- counting -----------------------------------------------------------------------------------
    def complete_count(self) -> int:
        # duplicates and candidates outside a learned limit are told COMPLETE but do not count
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if counted(t))

    def running_count(self) -> int:
        """RUNNING trials of every process (a stale one counts until someone fails it)."""
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    def counts(self) -> tuple[int, int]:
        """(complete, running) from ONE read: counted by two reads, a trial finishing in between would
        be in neither, and another trial would start beyond the budget."""
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        complete = sum(1 for t in trials if t.state == TrialState.COMPLETE and counted(t))
        running = sum(1 for t in trials if t.state == TrialState.RUNNING)
        return complete, running

    def running_jobs(self) -> list[TrialJob]:
        with self._lock:
            return list(self._running.values())

    def wants_trial(self) -> bool:
        """Another trial may start: complete + running (everyone's) < n_trials, time left, not cancelled.

        Check and ask are not one transaction: processes that both have a free slot and check in the
        same few milliseconds may both ask, so a study can overshoot by one trial per such process."""
        if self.cancelled or self.stop_reason is not None or self.spent:
            return False
        started = sum(self.counts())
        if started >= self.n_trials:
            return False
        if started and self.warm is not None and self.warm.pending():
            return False     # the twin's picks run right after the baseline: nothing else starts before them
        if search_hooks.spent(self, self.progress):   # nothing new left to propose
            self.spent = True
            return False
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            expected = expected_trial_s(self.store.trial_times(self.record.id)) or 0.0
            if left <= 0 or left < expected:
                if left > 0:
                    self.progress.message(f"not starting another trial: one takes ~{expected:.0f} s "
                                          f"and {left:.0f} s are left")
                self.stop_reason = "timeout"
                return False
        return True

    def budget_reached(self) -> bool:
        """The study holds its trials, or its space has nothing new left (the after-budget steps run)."""
        return self.spent or self.complete_count() >= self.n_trials

    def done(self) -> bool:
        """Nothing more for this process to do: budget reached (or stopped / cancelled) and nothing of
        ours running. Trials other processes still run are theirs to finish; one of them that stops
        beating is re-queued by `recover` while we are still here."""
        if self._running:
            return False
        return self.cancelled or self.stop_reason is not None or self.budget_reached()

    # -- one trial ----------------------------------------------------------------------------------
    def next_job(self) -> TrialJob | None:
        """Ask for a candidate and run the free checks; None when one rejected it (already told). If the
        storage fails after the ask (a database restart), the trial is let go: nothing runs it, so it
        must not keep beating, or it would stay RUNNING for good and its study could never finish;
        `recover` fails and re-queues it once its heartbeat is stale."""
        with self._lock:
            trial = ask_baseline_first(self.study)    # a re-queued baseline before every other candidate
            assert self.heartbeats is not None
            self.heartbeats.track(str(trial._trial_id), self.spec.name)
        try:
            return self._prepare(trial)
        except Exception:       # not a kill: a process that dies stops beating for all its trials anyway
            self._let_go(trial.number, trial._trial_id)
            raise

    def _let_go(self, number: int, trial_id: int) -> None:
        """This process no longer runs the trial: it leaves the running set and stops beating for it (the
        heartbeat row's delete is database I/O: not under our lock where the caller does not hold it)."""
        with self._lock:
            self._running.pop(number, None)
        assert self.heartbeats is not None
        self.heartbeats.untrack(str(trial_id))

    def _prepare(self, trial: optuna.Trial) -> TrialJob | None:
        with self._lock:
            role = trial.user_attrs.get("role", "search")
            # Enqueued trials (the baseline, re-queued ones) sample exactly their enqueued params, so what
            # Optuna records is what ran.
            params = self.space.suggest(trial, only=trial.user_attrs.get("enqueued"))
            flags = mapping_to_flags(self.spec.baseline or {}) if role == "baseline" else self.space.render(params)
            env = {} if role == "baseline" else self.space.render_env(params)
            violations = (self.space.violations(params, self.fixed_flags, self.spec.num_gpus)
                          if role != "baseline" else [])
            job = TrialJob(study=self.spec.name, number=trial.number, trial_id=trial._trial_id, role=role,
                           params=params, flags=flags, n_gpus=layout_gpus([*self.fixed_flags, *flags]),
                           exclusive=self.exclusive, violations=violations,
                           env=env, started_at=utcnow(), trial=trial)
            self._running[job.number] = job
            self.progress.trial_started(trial.number, role, self.complete_count(),
                                        [*flags, *(f"{k}={v}" for k, v in env.items())])
            self.store.save_trial(self.record.id, trial.number, state="running", optuna_trial_id=trial._trial_id,
                                  role=role, params=params, flags=flags, engine_version=self.engine_version,
                                  hardware=self.hardware, workload=self.spec.workload,
                                  spec_hash=self.spec.identity_hash(), started_at=job.started_at,
                                  host=self.host, identity=self.identity, env=env or None)
            if search_hooks.screen(self, trial, role, params, with_env(flags, env), self.progress):   # told, not launched
                self._let_go(job.number, trial._trial_id)
                return None
            search_hooks.predict(self, trial, params)   # the twin's prediction beside the trial
        rejected = self.runner.precheck(flags, violations)
        for check in self.before_launch:
            if rejected is not None:
                break
            rejected = check(self, job)
        if rejected is not None:
            search_hooks.rejected_before_launch(self, job.trial, rejected.cause, job.role)
            self.finish(job, None, rejected)
            return None
        return job

    def phase_for(self, job: TrialJob) -> Phase:
        if not self.tag_phases:
            return self.progress.phase
        return lambda text: self.progress.phase(f"[trial {job.number}] {text}")

    def run_job(self, job: TrialJob, lease: Lease, phase: Phase) -> TrialOutcome:
        """Worker thread: launch, measure, stop. Raises Interrupted when the scheduler stops it. The
        trial's start is now, not when it was asked: a wait for slots is not part of its wall time."""
        job.started_at = utcnow()
        self.store.save_trial(self.record.id, job.number, lease=lease.to_json(), started_at=job.started_at)
        with self._lock:
            stopper = search_hooks.stopper(self)   # early stopping against the front as it is now
            hint = search_hooks.capacity_hint(self, job.flags)   # the search starts near the study's capacities
        warm = self.warm if self.warm is not None and self.warm.pending() else None
        return self.runner.run(job.number, job.flags, [], phase, lease=lease, stopper=stopper, hint=hint,
                               before_load=(lambda: warm.wait(phase)) if warm is not None else None,
                               env=job.env)

    def finish(self, job: TrialJob, lease: Lease | None, outcome: TrialOutcome) -> None:
        """Tell Optuna and store the evidence (thread-safe). A trial whose measurement worker died measured
        nothing of the candidate: it is failed in our table and re-queued, not told (a candidate re-queued
        that way whose worker dies again is told as failed, so that no candidate is re-run forever)."""
        if outcome.cause == causes.WORKER_DIED and job.trial is not None \
                and not job.trial.user_attrs.get("after_worker_died"):
            self.interrupt(job, "its measurement worker died", state="failed", cause=causes.WORKER_DIED,
                           detail=f"{outcome.detail}; parameters re-queued",
                           evidence={"log_path": outcome.log_path, "log_tail": outcome.log_tail})
            return
        with self._lock:
            try:
                self._tell(job, outcome, lease)
                search_hooks.after_tell(self, job.number, job.params, job.flags, outcome, self.progress,
                                        launch=with_env(job.flags, job.env))
            finally:
                self._let_go(job.number, job.trial_id)
        for hook in self.after_tell:
            hook(self, job, outcome)

    def fail(self, job: TrialJob, cause: str, detail: str) -> None:
        """The scheduler's own failures of a job (it needs more GPUs than the pool has; a bug in its thread)."""
        self.finish(job, None, TrialOutcome("failed", cause, detail))

    @property
    def exclusive(self) -> bool:
        """Nothing else runs on the node beside this study's jobs (the spec's `exclusive`)."""
        return bool(getattr(self.spec, "exclusive", False))

    def interrupt(self, job: TrialJob, reason: str, *, state: str = "interrupted", cause: str = causes.INTERRUPTED,
                  detail: str | None = None, evidence: dict[str, Any] | None = None) -> None:
        """FAIL the trial (not counted), re-queue its parameters once, record it as interrupted (or, for a
        worker that died, as failed with that cause)."""
        with self._lock:
            try:
                try:
                    self.study._storage.set_trial_state_values(job.trial_id, TrialState.FAIL)
                except _LOST_RACE:
                    pass
                if self.claim(f"requeue:{job.number}"):
                    self._requeue(job.params, job.role, job.number,
                                  **({"after_worker_died": True} if cause == causes.WORKER_DIED else {}))
                self.store.save_trial(self.record.id, job.number, state=state, cause=cause,
                                      detail=detail or f"stopped by {reason}; parameters re-queued",
                                      **(evidence or {}), **self._overlap_fields(job))
                self.progress.trial_finished(job.number, job.role, state, None,
                                             reason if cause == causes.INTERRUPTED else f"{cause}: {reason}")
            finally:
                self._let_go(job.number, job.trial_id)

    def still_ours(self, job: TrialJob) -> bool:
        """False once another process has failed this trial (our heartbeats did not reach it in time)."""
        try:
            return self.study._storage.get_trial(job.trial_id).state == TrialState.RUNNING
        except Exception:
            return True

    def _overlap_fields(self, job: TrialJob) -> dict[str, Any]:
        """The trials of this study (any process) whose run overlapped ours, the measurement flag, and the
        finish time the relation was computed with (written as ours, so that a trial leased after it
        cannot see us as still running); an earlier finisher that missed us gets us added."""
        end = utcnow()
        start = job.started_at or end
        records = self.store.trials_between(self.record.id, start, end)   # not the whole study: every tell
        overlapped = overlapping(records, job.number, start, end)
        flags = {r.number: r.measurement_flags or [] for r in records}
        for number, mutual in missed_by(records, job.number, overlapped).items():
            self.store.save_trial(self.record.id, number, overlapped=mutual,
                                  measurement_flags=sorted({*flags[number], OVERLAPPED}))
        return {"overlapped": overlapped, "measurement_flags": [OVERLAPPED] if overlapped else [], "finished_at": end}

    def _tell(self, job: TrialJob, outcome: TrialOutcome, lease: Lease | None) -> None:
        trial = job.trial
        assert trial is not None
        headroom_value = None
        if outcome.telemetry is not None:
            headroom_value = headroom_violation(outcome.telemetry, self.spec.telemetry.headroom_margin)
        values = pick(self.spec.objectives, outcome.observed) if outcome.state != "failed" else None
        if outcome.state == "failed" or values is None:
            if outcome.state != "failed":
                outcome.state, outcome.cause = "failed", outcome.cause or causes.CRASH
                outcome.detail = outcome.detail or "an objective could not be measured"
            constraints = failure_constraints(self.slo, self.headroom_constraint)
            told = self._placeholders()
        else:
            constraints = measured_constraints(self.slo, outcome.metrics, headroom_value, self.headroom_constraint)
            told = values
            stopped = outcome.state == "stopped"   # told its bound (early_stopped): never measured, never exported
            if not all(v <= 0 for v in constraints.values()) and not stopped:
                outcome.state = "infeasible"
            if not stopped:
                trial.set_user_attr("measured", True)
        evidence = outcome_evidence(outcome)
        if outcome.startup is not None and outcome.startup.engine_version:
            # The API server has no --version: its version is known once one launch has logged its banner.
            self.engine_version = outcome.startup.engine_version
            self.identity["engine_version"] = self.engine_version
        evidence["engine_version"] = self.engine_version
        measured = dict(zip(self.spec.objectives, values)) if values is not None and outcome.state != "stopped" else {}
        overlap = self._overlap_fields(job)
        flags = sorted(set(overlap.pop("measurement_flags")) | set(evidence.pop("measurement_flags", None) or ())
                       | ({"client_saturated"} if outcome.cause == causes.CLIENT_SATURATED else set()))
        # The evidence is written before Optuna is told: a storage that fails here (disk full) leaves the
        # trial RUNNING in Optuna and 'running' in our table, which recovery re-queues; a process killed
        # between the two leaves a saved row, which recovery tells Optuna from (_tell_from_evidence).
        self.store.save_trial(self.record.id, job.number, objectives=measured, constraints=constraints,
                              identity=self.identity, measurement_flags=flags, **overlap, **evidence)
        try:
            self._tell_optuna(trial, constraints, outcome.cause, told)
        except (UpdateFinishedTrialError, ValueError, RuntimeError):
            # Another process judged us dead (stale heartbeat). It told the trial from the evidence just
            # saved (COMPLETE: the row stands), or it failed it and re-queued these parameters.
            if self.study._storage.get_trial(job.trial_id).state != TrialState.COMPLETE:
                evidence.update(state="interrupted", cause=causes.INTERRUPTED,
                                detail="finished after another process had judged it dead (its heartbeat was "
                                       "stale) and re-queued its parameters")
                self.store.save_trial(self.record.id, job.number, state=evidence["state"],
                                      cause=evidence["cause"], detail=evidence["detail"])
        if outcome.measurement is not None:
            rec = self.store.trial(self.record.id, job.number)
            assert rec is not None
            self.store.add_series(rec.id, "requests", outcome.measurement.to_json()["requests"])
            if outcome.telemetry is not None and outcome.telemetry.series:
                from autotune.telemetry import series_for_store
                self.store.add_series(rec.id, "telemetry", series_for_store(outcome.telemetry))
        note = outcome.cause or ""
        if outcome.state == "infeasible":
            broken = [k for k, v in constraints.items() if v > 0]
            note = "breaks " + ", ".join(broken) + (f" ({outcome.cause})" if outcome.cause else "")
        self.progress.trial_finished(job.number, job.role, evidence["state"], measured or None, note)

    # -- the end ------------------------------------------------------------------------------------
    def feasible_trials(self) -> list[optuna.trial.FrozenTrial]:
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("measured") and all(v <= 0 for v in t.constraints.values()):
                out.append(t)
        return out

    def after_budget_due(self) -> bool:
        """An after-budget job may start now: the study reached its trials (not stopped, not cancelled),
        none of its trials runs here, and a part of its steps is waiting (the confirmation's rounds are
        parts: with free slots, several run at once)."""
        return (self._opened and bool(self.after_budget) and not self.after_budget_finished
                and self.stop_reason is None and not self.cancelled and not self._running and self.budget_reached()
                and self._budget.ready())

    def after_budget_gpus(self) -> int:
        """GPUs the next after-budget job leases: what its part asks for (the largest layout it launches)."""
        return self._budget.next_gpus()

    def usual_gpus(self) -> int:
        """The study's own layout: the fixed flags with the baseline's."""
        return layout_gpus([*self.fixed_flags, *mapping_to_flags(self.spec.baseline or {})])

    def run_after_budget(self, lease: Lease, phase: Phase) -> None:
        """Job thread: the next part of the steps. Interrupted propagates (the scheduler records it as the
        stop reason); rows the steps already stored stay, so the next run continues where this one stopped."""
        self._budget.run_next(lease, phase)

    def close(self) -> StudyResult:
        """Keep the best series and stop beating for this study. The after-budget steps ran before, as
        the scheduler's job (`run_after_budget`)."""
        try:
            if self._opened:
                self._keep_best_series()
        finally:
            if self._own_heartbeats and self.heartbeats is not None:
                self.heartbeats.stop()
            if self._opened:
                self.progress.__exit__(None, None, None)
        return self.result()

    def result(self) -> StudyResult:
        return StudyResult(self.complete_count(), len(self.feasible_trials()), self.stop_reason)

    def _keep_best_series(self) -> None:
        """Raw series are kept for the best few trials only, so the DB stays small overnight."""
        best = sorted(self.feasible_trials(), key=lambda t: -t.values[0]
                      if self.spec.directions()[0] == "maximize" else t.values[0])[: self.spec.keep_series]
        keep = {rec.id for rec in self.store.trials(self.record.id) if rec.number in {t.number for t in best}}
        self.store.keep_series_only_for(self.record.id, keep)


__all__ = ["StudyDriver", "StudyResult", "TrialJob", "expected_trial_s", "layout_gpus", "log_dir_for"]
