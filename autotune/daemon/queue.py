"""The study queue, kept in the daemon's database (`autotune_queue`), so that a daemon needs nothing but
its `--storage` URL: a submitted spec is stored fully resolved, and every daemon on every host reads
the same rows.

A study stays `queued` while daemons work on it; it leaves the queue (`done`, or `cancelled`) once,
whoever sees it first: a conditional UPDATE decides, so two daemons never both record the end. Its
time budget counts the seconds in which at least one daemon had a trial of it running, across daemon
restarts and hosts: each daemon adds the time since the last tick by anyone (compare-and-set on
`tick_at`, capped so a gap while no daemon ran is not counted).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, Text, inspect, select, update
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Mapped, Session, mapped_column

from autotune.errors import UserError
from autotune.store.models import Base, utcnow
from autotune.store.repository import make_engine, sqlite_path
from autotune.store.urls import mask_url

QUEUED, DONE, CANCELLED = "queued", "done", "cancelled"


class QueueRecord(Base):
    """One submitted study. `spec` is the resolved spec (search space inline, model path absolute,
    secret environment values left out); `seconds_used` survives restarts."""

    __tablename__ = "autotune_queue"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    n_trials: Mapped[int] = mapped_column(Integer)
    time_budget_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    seconds_used: Mapped[float] = mapped_column(Float, default=0.0)
    tick_at: Mapped[float | None] = mapped_column(Float, nullable=True)   # epoch seconds of the last tick
    state: Mapped[str] = mapped_column(String(16), default=QUEUED)
    cancel_now: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)       # why it left the queue
    submitted_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


@dataclass(frozen=True)
class Entry:
    """A queue row detached from its session (what status and the daemon loop read)."""

    name: str
    spec: dict[str, Any]
    priority: int
    n_trials: int
    time_budget_s: float | None
    seconds_used: float
    state: str
    cancel_now: bool
    reason: str | None
    submitted_at: dt.datetime
    finished_at: dt.datetime | None

    @classmethod
    def of(cls, r: QueueRecord) -> "Entry":
        return cls(r.name, r.spec, r.priority, r.n_trials, r.time_budget_s, r.seconds_used or 0.0, r.state,
                   bool(r.cancel_now), r.reason, r.submitted_at, r.finished_at)

    def budget_left_s(self) -> float | None:
        return None if self.time_budget_s is None else self.time_budget_s - self.seconds_used


class StudyQueue:
    def __init__(self, url: str, create: bool = True) -> None:
        self.url = url
        path = sqlite_path(url)
        if path is not None and not create and not path.is_file():
            raise UserError(f"storage {url}: no such database file")
        self.engine = make_engine(url)
        try:
            if create:
                # two daemons starting at once on PostgreSQL may race on CREATE TABLE: the loser finds it made
                try:
                    QueueRecord.__table__.create(self.engine, checkfirst=True)  # type: ignore[attr-defined]
                except (IntegrityError, ProgrammingError):
                    pass
            with self.engine.connect() as conn:
                if not create and not inspect(conn).has_table(QueueRecord.__tablename__):
                    raise UserError(f"storage {mask_url(url)} holds no study queue (nothing was submitted there)")
        except OperationalError as e:
            raise UserError(f"storage {mask_url(url)}: cannot connect: {mask_url(str(e.orig)).strip().splitlines()[0]}") \
                from None

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def submit(self, name: str, spec: dict[str, Any], *, priority: int, n_trials: int,
               time_budget_s: float | None) -> Entry:
        """Queue a study, or queue again one that is done or cancelled (with a fresh time budget;
        `n_trials` stays the total of complete trials the study should hold, so trials it ran count)."""
        with self._session() as s:
            rec = s.scalar(select(QueueRecord).where(QueueRecord.name == name))
            if rec is not None and rec.state == QUEUED:
                raise UserError(f"study {name!r} is already queued (cancel it first to change it)")
            if rec is None:
                rec = QueueRecord(name=name)
                s.add(rec)
            rec.spec, rec.priority, rec.n_trials, rec.time_budget_s = spec, priority, n_trials, time_budget_s
            rec.seconds_used, rec.tick_at, rec.state, rec.cancel_now = 0.0, None, QUEUED, False
            rec.reason, rec.finished_at, rec.submitted_at = None, None, utcnow()
            try:
                s.commit()
            except IntegrityError:
                raise UserError(f"study {name!r} was submitted at the same moment by someone else") from None
            return Entry.of(rec)

    def cancel(self, name: str, now: bool = False) -> Entry:
        with self._session() as s:
            rec = s.scalar(select(QueueRecord).where(QueueRecord.name == name))
            if rec is None:
                names = ", ".join(s.scalars(select(QueueRecord.name).order_by(QueueRecord.id))) or "none"
                raise UserError(f"no study named {name!r} in the queue (there: {names})")
            if rec.state != QUEUED:
                raise UserError(f"study {name!r} is not queued ({rec.reason or rec.state})")
            rec.state, rec.cancel_now, rec.finished_at = CANCELLED, now, utcnow()
            rec.reason = "cancelled" + (" (running trials interrupted)" if now else " (running trials finish)")
            s.commit()
            return Entry.of(rec)

    def entries(self, states: tuple[str, ...] = (QUEUED, DONE, CANCELLED)) -> list[Entry]:
        """Highest priority first, then first submitted: the order in which daemons pick studies up."""
        with self._session() as s:
            rows = s.scalars(select(QueueRecord).where(QueueRecord.state.in_(states))
                             .order_by(QueueRecord.priority.desc(), QueueRecord.submitted_at, QueueRecord.id))
            return [Entry.of(r) for r in rows]

    def entry(self, name: str) -> Entry | None:
        with self._session() as s:
            rec = s.scalar(select(QueueRecord).where(QueueRecord.name == name))
            return None if rec is None else Entry.of(rec)

    def finish(self, name: str, reason: str) -> bool:
        """The study leaves the queue as done; True for the one caller that made it so."""
        with self._session() as s:
            res = s.execute(update(QueueRecord).where(QueueRecord.name == name, QueueRecord.state == QUEUED)
                            .values(state=DONE, reason=reason, finished_at=utcnow()))
            s.commit()
            return bool(res.rowcount)

    def tick(self, name: str, cap_s: float, now: float | None = None) -> float:
        """Count the seconds since the last tick (by any daemon) as used, at most `cap_s`; the new total.

        Called by each daemon, every poll, for each study it has a trial of running. A lost
        compare-and-set means another daemon counted the same moment: nothing is added twice. After a
        pause (no daemon running it, or none alive) the first tick adds at most `cap_s`."""
        now = time.time() if now is None else now
        with self._session() as s:
            rec = s.scalar(select(QueueRecord).where(QueueRecord.name == name))
            if rec is None:
                return 0.0
            used, last = rec.seconds_used or 0.0, rec.tick_at
            add = 0.0 if last is None else min(max(now - last, 0.0), cap_s)
            cond = QueueRecord.tick_at.is_(None) if last is None else QueueRecord.tick_at == last
            res = s.execute(update(QueueRecord).where(QueueRecord.name == name, cond)
                            .values(seconds_used=used + add, tick_at=now))
            s.commit()
            return used + add if res.rowcount else used


def submit_to(storage: str, body: dict[str, Any]) -> dict[str, Any]:
    """Queue a resolved spec (what `submit --storage` and the daemon's POST /submit both do)."""
    from autotune.spec import build_spec

    if not isinstance(body.get("spec"), dict) or not isinstance(body.get("name"), str):
        raise UserError("submit: needs name and spec")
    build_spec(dict(body["spec"], storage=None), f"submitted spec {body['name']}")   # still a valid spec
    try:
        priority, n_trials = int(body.get("priority") or 0), int(body["n_trials"])
        budget = None if body.get("time_budget_s") is None else float(body["time_budget_s"])
    except (KeyError, TypeError, ValueError):
        raise UserError("submit: priority, n_trials and time_budget_s must be numbers") from None
    create_tables(storage)
    e = StudyQueue(storage).submit(body["name"], body["spec"], priority=priority, n_trials=n_trials,
                                   time_budget_s=budget)
    return {"queued": e.name, "priority": e.priority, "n_trials": e.n_trials}


def create_tables(url: str) -> None:
    """Every table a daemon uses (the queue, autotune's, Optuna's), made before anything else: two
    daemons starting together on a fresh PostgreSQL database race on CREATE TABLE, and the loser tries
    again and finds the tables made (the driver's own opening does the same)."""
    import optuna

    from autotune.store.repository import ResultStore
    from autotune.tuner.sharing import first_to_create

    first_to_create(lambda: StudyQueue(url)).engine.dispose()
    first_to_create(lambda: ResultStore(url)).engine.dispose()
    first_to_create(lambda: optuna.storages.RDBStorage(url)).engine.dispose()
