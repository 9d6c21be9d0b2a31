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


class TrialRecord(Base):
    """One trial's evidence. `state` is ok / failed / infeasible / interrupted; `cause` is one of
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


class SeriesRecord(Base):
    """Raw evidence kept for the best trials only (bounded): per-request records and telemetry series."""

    __tablename__ = "autotune_series"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("autotune_trials.id"))
    kind: Mapped[str] = mapped_column(String(16))   # requests | telemetry
    data: Mapped[list[Any]] = mapped_column(JSON)


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


class WorkloadProfileRecord(Base):
    """What the study's workload looks like (bench/profile.py: lengths, arrivals, burstiness, prefix
    sharing), computed once when the study is opened, so `show` and the report can say what traffic the
    numbers were measured under without the trace file."""

    __tablename__ = "autotune_workload_profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autotune_studies.id"), unique=True)
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
