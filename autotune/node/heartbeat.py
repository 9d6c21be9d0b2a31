"""Liveness by heartbeat, never by "the PID is gone" (which holds only for one process on one host).

Each process beats a `process` row, and a `trial` row for every trial it runs, every `interval_s`
(default 10 s; AUTOTUNE_HEARTBEAT_S sets it, e.g. for tests). `beat_at` is written with the DATABASE's
clock and ages are computed by the database too (`now() - beat_at`), so hosts whose clocks disagree
still agree on what is stale. A row older than STALE_INTERVALS intervals is stale: its owner is dead,
hung or cut off, and whoever sees it first may fail the trial and re-queue it (tuner/driver.py).

A trial with no row at all (asked by a process killed before its first beat, or by an autotune
older than heartbeats) is judged by how long THIS observer has seen it missing, on its own monotonic
clock: stale once missing for the same limit.

    >>> hb = Heartbeats(make_engine("sqlite://"), interval_s=0.2)                  # doctest: +SKIP
    >>> hb.start(); hb.track("17", study="s"); hb.ages("trial")["17"].age_s < hb.stale_after_s
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from autotune.engine.process import owner_alive_here, process_create_time
from autotune.node.pool import host_name
from autotune.store.models import HeartbeatRecord

INTERVAL_ENV = "AUTOTUNE_HEARTBEAT_S"
DEFAULT_INTERVAL_S = 10.0
STALE_INTERVALS = 3          # a row older than this many intervals is stale

log = logging.getLogger(__name__)
T = HeartbeatRecord.__table__


def interval_s() -> float:
    """The heartbeat interval in seconds (AUTOTUNE_HEARTBEAT_S, else 10)."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S


def _now(engine: Engine) -> Any:
    """The database's current time as an SQL expression (SQLite: UTC with milliseconds)."""
    if engine.dialect.name == "sqlite":
        return func.strftime("%Y-%m-%d %H:%M:%f", "now")
    return func.now()


def _age(engine: Engine) -> Any:
    """Seconds since beat_at by the database's clock."""
    if engine.dialect.name == "sqlite":
        return (func.julianday("now") - func.julianday(T.c.beat_at)) * 86400.0
    return func.extract("epoch", func.now() - T.c.beat_at)


@dataclass(frozen=True)
class Beat:
    key: str
    study: str | None
    host: str
    pid: int
    proc_create_time: float
    age_s: float
    info: dict[str, Any] | None


class Heartbeats:
    """This process's heartbeats on one database, and everyone's ages. Thread-safe."""

    def __init__(self, engine: Engine, *, interval_s: float | None = None, host: str | None = None) -> None:
        self.engine = engine
        HeartbeatRecord.__table__.create(engine, checkfirst=True)
        self.interval_s = interval_s if interval_s is not None else globals()["interval_s"]()
        self.host = host or host_name()
        self.pid = os.getpid()
        self.create_time = process_create_time()
        self.process_key = f"{self.host}:{self.pid}:{self.create_time:.2f}"
        self.process_info: dict[str, Any] = {}
        self._tracked: dict[str, str | None] = {}
        self._missing_since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stale_after_s(self) -> float:
        return STALE_INTERVALS * self.interval_s

    # -- writing ------------------------------------------------------------------------------------
    def beat(self, kind: str, key: str, study: str | None = None, info: dict[str, Any] | None = None) -> None:
        """Insert or refresh one row, stamped with the database's clock."""
        values: dict[str, Any] = dict(beat_at=_now(self.engine), host=self.host, pid=self.pid,
                                      proc_create_time=self.create_time, study=study)
        if info is not None:
            values["info"] = info
        where = and_(T.c.kind == kind, T.c.key == key)
        with self.engine.begin() as conn:
            if conn.execute(update(T).where(where).values(**values)).rowcount:
                return
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(T).values(kind=kind, key=key, **values))
        except IntegrityError:
            with self.engine.begin() as conn:
                conn.execute(update(T).where(where).values(**values))

    def forget(self, kind: str, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(T).where(T.c.kind == kind, T.c.key == key))

    def track(self, key: str, study: str | None = None) -> None:
        """Beat this trial now and on every interval until `untrack`."""
        with self._lock:
            self._tracked[key] = study
        self.beat("trial", key, study)

    def untrack(self, key: str, forget: bool = True) -> None:
        with self._lock:
            self._tracked.pop(key, None)
        if forget:
            try:
                self.forget("trial", key)
            except OperationalError as e:   # the next observer ages it out instead
                log.warning("could not remove the heartbeat of trial %s: %s", key, e)

    def beat_all(self) -> None:
        self.beat("process", self.process_key, None, self.process_info or None)
        with self._lock:
            tracked = dict(self._tracked)
        for key, study in tracked.items():
            self.beat("trial", key, study)

    def start(self) -> "Heartbeats":
        """Beat this process (and its tracked trials) from a background thread."""
        self.beat_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="autotune-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat_all()
            except Exception as e:  # a locked or unreachable database: try again next interval
                log.warning("heartbeat failed: %s", e)

    def stop(self) -> None:
        """Stop beating and remove this process's row (its trial rows go with `untrack`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            self.forget("process", self.process_key)
        except Exception as e:
            log.warning("could not remove the process heartbeat: %s", e)

    # -- reading ------------------------------------------------------------------------------------
    def ages(self, kind: str, keys: Iterable[str] | None = None, study: str | None = None) -> dict[str, Beat]:
        """Rows of `kind` (optionally only `keys` / one study) with their age by the database's clock."""
        q = select(T.c.key, T.c.study, T.c.host, T.c.pid, T.c.proc_create_time, _age(self.engine).label("age"),
                   T.c.info).where(T.c.kind == kind)
        if keys is not None:
            q = q.where(T.c.key.in_(list(keys)))
        if study is not None:
            q = q.where(T.c.study == study)
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return {r.key: Beat(r.key, r.study, r.host, r.pid, r.proc_create_time, float(r.age or 0.0), r.info)
                for r in rows}

    def stale(self, keys: Iterable[str]) -> set[str]:
        """The trial keys whose owner is presumed dead: a row older than the limit, or no row for
        longer than the limit as this observer counts."""
        keys = set(keys)
        if not keys:
            return set()
        beats = self.ages("trial", keys)
        now = time.monotonic()
        # A row older than the limit; or, for an owner on THIS host, one whose process is gone: on its
        # own host a PID with its create time is certain, and waiting out the limit would only delay
        # the re-run of a trial a killed `run` left behind.
        out = {k for k, b in beats.items() if b.age_s > self.stale_after_s
               or (b.host == self.host and not owner_alive_here(b.pid, b.proc_create_time))}
        for k in keys - set(beats):
            first = self._missing_since.setdefault(k, now)
            if now - first >= self.stale_after_s:
                out.add(k)
        for k in set(beats):
            self._missing_since.pop(k, None)
        return out

    def live_processes(self) -> list[Beat]:
        """Processes with a fresh heartbeat (what `status` lists as daemons)."""
        return [b for b in self.ages("process").values() if b.age_s <= self.stale_after_s]


__all__ = ["Beat", "Heartbeats", "interval_s", "owner_alive_here", "process_create_time",
           "STALE_INTERVALS", "INTERVAL_ENV"]
