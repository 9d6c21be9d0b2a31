"""autotune's own tables, beside Optuna's in the same database (DESIGN.md, principle 4).

Optuna owns search state (params, objective values, constraints). These tables hold the evidence a
person needs to trust a result. All names start with `autotune_` so they never collide with Optuna's.
JSON columns keep the schema stable while measurements grow new fields.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class StudyRecord(Base):
    """One study: what it tunes and how, so `show`/`export` need nothing but the DB."""

    __tablename__ = "autotune_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    model: Mapped[str] = mapped_column(Text)
    engine_kind: Mapped[str] = mapped_column(String(32))
    engine_command: Mapped[list[str]] = mapped_column(JSON)
    fixed_flags: Mapped[list[str]] = mapped_column(JSON)
    space_hash: Mapped[str] = mapped_column(String(64))
    spec_hash: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)           # the resolved spec (no secrets)
    objectives: Mapped[list[list[str]]] = mapped_column(JSON)   # [[name, "maximize"|"minimize"], ...]
    slo: Mapped[str] = mapped_column(Text)
    quality_knobs: Mapped[list[str]] = mapped_column(JSON, default=list)  # searched knobs that change output
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    # how the verdict measures one configuration's spread (tuner/verdict.py), stamped when the first
    # confirmation round is stored and never changed after; unset on studies confirmed before the stamp
    spread_rule: Mapped[str | None] = mapped_column(String(16), nullable=True)


class TrialRecord(Base):
    """One trial's evidence. `state` is ok / failed / infeasible / interrupted / stopped (early, never
    exported) / duplicate (its flags already ran: not launched, not counted); `cause` is one of
    autotune.causes when it failed. Objective values here are measurements only: a failed trial's
    placeholders live in Optuna, never here."""

    __tablename__ = "autotune_trials"
    __table_args__ = (UniqueConstraint("study_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id"))
    number: Mapped[int] = mapped_column(Integer)            # Optuna's trial.number
    optuna_trial_id: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16), default="search")   # baseline | search | enqueued
    state: Mapped[str] = mapped_column(String(16))
    cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    flags: Mapped[list[str]] = mapped_column(JSON)          # candidate flags as launched (fixed flags excluded)
    objectives: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)   # measured values only
    constraints: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)        # Measurement.metrics at the reported load
    capacity: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # mode, capacity, steps
    telemetry: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # TelemetrySummary sans series
    startup: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)    # StartupInfo
    startup_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    kv_cache_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    engine_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    workload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    spec_hash: Mapped[str] = mapped_column(String(64))
    simulated: Mapped[bool] = mapped_column(default=False)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # Where and beside what it ran (the scheduler); nullable so that old databases open (store/migrate.py).
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    lease: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)         # gpus, cores, port
    overlapped: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)        # trial numbers
    measurement_flags: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # e.g. overlapped
    identity: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)     # gpu model, engine, spec
    # Environment variables the candidate's env knobs set at launch (space/params.py `env`); the study's own
    # engine.env is not here (it may hold secrets).
    env: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    client: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)       # measurement worker: pid, cpu_s, wall_s


class ConfirmationRecord(Base):
    """One repeat of a trial's configuration on a fresh server (tuner/confirm.py): a full capacity search
    with the round's prompt seed, which the baseline and every candidate of that round share. Optuna's
    values stay the first run's; these rows are what `show` and `export` call confirmed."""

    __tablename__ = "autotune_confirmations"
    __table_args__ = (UniqueConstraint("trial_id", "round"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id"))
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id"))
    round: Mapped[int] = mapped_column(Integer)              # 0-based; one paired A/B round shares a seed
    position: Mapped[int] = mapped_column(Integer)           # order inside the round (interleaving)
    seed: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))           # ok | failed | infeasible
    cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    objectives: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)   # measured values only
    constraints: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    capacity: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    measurement_flags: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    simulated: Mapped[bool] = mapped_column(default=False)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    lease: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)   # the after-budget job's lease
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # TelemetrySummary sans series, as for a trial: a repeat's peak memory weighs like the first run's
    telemetry: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class SeriesRecord(Base):
    """Raw evidence kept for the best trials only (bounded): per-request records and telemetry series."""

    __tablename__ = "autotune_series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id"))
    kind: Mapped[str] = mapped_column(String(16))   # requests | telemetry
    data: Mapped[list[Any]] = mapped_column(JSON)


class LimitRecord(Base):
    """A limit learned from a failure that stated it (tuner/narrowing.py): candidates outside it are not
    launched for the rest of the study."""

    __tablename__ = "autotune_limits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id"))
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)   # the failure that taught it
    param: Mapped[str] = mapped_column(String(64))
    op: Mapped[str] = mapped_column(String(2))
    value: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    when: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class PredictionRecord(Base):
    """The twin's prediction for a trial (tuner/warmstart.py), kept beside the measurement. Simulated."""

    __tablename__ = "autotune_predictions"
    __table_args__ = (UniqueConstraint("study_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id"))
    number: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16), default="twin")
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)   # among the candidates the twin ranked
    predicted: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ProcessRecord(Base):
    """Servers autotune has started and not yet seen stopped, so a run after a SIGKILL can stop
    what the killed run left behind before launching anything."""

    __tablename__ = "autotune_processes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_name: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    pgid: Mapped[int] = mapped_column(Integer)
    create_time: Mapped[float] = mapped_column(Float)   # psutil create_time: guards against PID reuse
    owner_pid: Mapped[int] = mapped_column(Integer)     # the autotune process that started it
    port: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)      # only this host may stop it
    owner_create_time: Mapped[float | None] = mapped_column(Float, nullable=True)


class HeartbeatRecord(Base):
    """A live process or running trial. `beat_at` is written with the database's clock and judged
    against the same clock, so hosts with skewed clocks agree on what is stale (node/heartbeat.py)."""

    __tablename__ = "autotune_heartbeats"
    __table_args__ = (UniqueConstraint("kind", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))          # trial | process
    key: Mapped[str] = mapped_column(String(255))          # optuna trial id | host:pid:create_time
    study: Mapped[str | None] = mapped_column(String(255), nullable=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    proc_create_time: Mapped[float] = mapped_column(Float)
    beat_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    info: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class EnqueuedRecord(Base):
    """One row per enqueue (the baseline, a spec candidate, a re-queued trial), inserted BEFORE the
    enqueue: the unique key makes the enqueue happen once across processes and hosts."""

    __tablename__ = "autotune_enqueued"
    __table_args__ = (UniqueConstraint("study", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(512))
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class WorkloadProfileRecord(Base):
    """What the study's workload looks like (bench/profile.py: lengths, arrivals, burstiness, prefix
    sharing), computed once when the study is opened, so `show` and the report can say what traffic the
    numbers were measured under without the trace file."""

    __tablename__ = "autotune_workload_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id"), unique=True)
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
