"""One study, several processes or hosts: what makes sharing the storage safe.

Each process seeds its sampler differently; the loser of the race to create a fresh database retries;
an enqueue (the baseline, a spec candidate, a re-queued trial) happens only after its row in
`autotune_enqueued` is inserted, so it happens once; a host whose GPU model, engine version or spec
differs from the study's first trials is refused; servers are stopped only on their own host and
only when their owner is dead; every trial knows which trials ran beside it; and a re-queued baseline
is asked before the candidates queued after it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import time
from typing import Any, Callable, Sequence

import optuna
from sqlalchemy import insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from autotune import causes
from autotune.node.heartbeat import owner_alive_here
from autotune.node.pool import host_name
from autotune.spec import StudySpec
from autotune.store.models import EnqueuedRecord, ProcessRecord, TrialRecord, utcnow


def sampler_seed(spec_seed: int, host: str, pid: int, trials_so_far: int) -> int:
    """Each process seeds differently: two processes (or a resumed one) with the spec's fixed seed
    would otherwise propose the very same candidates."""
    digest = hashlib.sha256(f"{spec_seed}:{host}:{pid}:{trials_so_far}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def make_sampler(spec: StudySpec, trials_so_far: int = 0, host: str | None = None,
                 pid: int | None = None) -> optuna.samplers.BaseSampler:
    """TPE with `constant_liar`: trials still running count as (pessimistic) results, so concurrent
    asks spread out instead of proposing the same region."""
    seed = sampler_seed(spec.seed, host or host_name(), os.getpid() if pid is None else pid, trials_so_far)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if spec.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, constant_liar=True)


def ask_baseline_first(study: optuna.Study) -> optuna.Trial:
    """Optuna's next trial, except that a waiting baseline goes before every other waiting trial. Optuna
    pops the oldest waiting trial, and a baseline re-queued after an interruption (`--timeout`, a drain, a
    dead owner) is newer than the candidates queued behind it (the spec's, the twin's picks); but every
    other trial is judged against the defaults, and the capacity hint starts from the first measured
    brackets. A baseline another process takes first is left to it (its state is no longer WAITING)."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        if t.user_attrs.get("role") != "baseline":
            continue
        try:
            if study._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.RUNNING):
                study._thread_local.cached_all_trials = None     # as Study.ask: read the storage afresh
                return optuna.Trial(study, t._trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return study.ask()


def first_to_create(make: Callable[[], Any], attempts: int = 5) -> Any:
    """Two processes opening a new database at once race to create its tables (Optuna's schema version
    row, our tables): the loser's IntegrityError / "already exists" is retried once the winner is done."""
    for attempt in range(attempts):
        try:
            return make()
        except (IntegrityError, OperationalError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.3 * (attempt + 1))


def gpu_model(hw: dict[str, Any]) -> str | None:
    """The accelerator a trial ran on, from its hardware stamp (the simulated one on the simulator)."""
    if hw.get("simulated_gpu"):
        return f"simulated {hw['simulated_gpu']}"
    names = sorted({g.get("name") for g in hw.get("gpus") or [] if g.get("name")})
    return ", ".join(names) or None


def identity_conflict(records: Sequence[TrialRecord], identity: dict[str, Any]) -> str | None:
    """How this host differs from the study's first trials that recorded an identity, or None."""
    first: dict[str, tuple[Any, int]] = {}
    for rec in records:
        for key, value in (rec.identity or {}).items():
            if value is not None:
                first.setdefault(key, (value, rec.number))
    words = {"gpu_model": "GPU model", "engine_version": "engine version", "spec": "spec"}
    for key, word in words.items():
        mine = identity.get(key)
        if key in first and mine is not None and first[key][0] != mine:
            return f"this host's {word} ({mine}) differs from trial {first[key][1]}'s ({first[key][0]})"
    return None


def claim(engine: Engine, study: str, key: str, host: str) -> bool:
    """Insert (study, key) into autotune_enqueued; True for the one process that inserted it."""
    try:
        with engine.begin() as conn:
            conn.execute(insert(EnqueuedRecord.__table__).values(
                study=study, key=key, host=host, pid=os.getpid(), created_at=utcnow()))
        return True
    except IntegrityError:
        return False


def dead_owner_servers(records: Sequence[ProcessRecord], host: str, own_running: bool) -> list[ProcessRecord]:
    """Recorded servers of this host whose owner is dead (only a process on that host may stop them)."""
    out = []
    for p in records:
        if (p.host or host) != host:
            continue
        if p.owner_create_time is not None:     # PID and create time: certain on its own host
            dead = not owner_alive_here(p.owner_pid, p.owner_create_time)
        else:                                   # a record from before owner create times were kept
            dead = (p.owner_pid == os.getpid() and not own_running) or not owner_alive_here(p.owner_pid, None)
        if dead:
            out.append(p)
    return out


def overlapping(records: Sequence[TrialRecord], number: int, start: dt.datetime, end: dt.datetime) -> list[int]:
    """Trials (any process) that ran between start and end, besides `number`. Only a row with a lease ran a
    server: a trial that was asked but still waits for a slot, or was rejected before launch, does not
    count (its row's start is the ask, rewritten when it is leased)."""
    out = []
    for rec in records:
        if rec.number == number or rec.lease is None or rec.cause in (causes.CONSTRAINT, causes.PREDICTED_OOM):
            continue
        if rec.started_at is not None and rec.started_at < end and (rec.finished_at is None
                                                                   or rec.finished_at > start):
            out.append(rec.number)
    return out


def missed_by(records: Sequence[TrialRecord], number: int, overlapped: Sequence[int]) -> dict[int, list[int]]:
    """Finished trials that overlapped `number` but do not list it, with their corrected lists. A trial
    that finished while `number`'s start was being written (another thread or process) could not see it;
    the later finisher writes both sides, so the relation stays mutual."""
    out = {}
    for rec in records:
        if rec.number in overlapped and rec.finished_at is not None and number not in (rec.overlapped or []):
            out[rec.number] = sorted({*(rec.overlapped or []), number})
    return out
