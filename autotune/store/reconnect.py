"""Riding out a database restart in the middle of a trial (PostgreSQL shared by several hosts).

A trial's own storage writes (its lease at the start, its server's record, the tell and the evidence at
the end) happen once, in its worker thread: a write that fails while the database host restarts would
lose a trial that was measured correctly. Everything else already retries by repeating (the scheduler's
pass, the heartbeat thread, the daemon's queue poll), so only the worker threads wait: inside
`patient()`, opening a connection that the server refuses is retried until it answers or
`PATIENCE_S` has passed. A CLI command given a wrong URL still fails at once.

Connections already in a pool are checked before use (`pool_pre_ping`, set by `make_engine` and by
the driver for Optuna's engine), so the first call after the restart opens a new one instead of
failing on a connection the old server closed.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from sqlalchemy import event
from sqlalchemy.engine import Engine

PATIENCE_S = 300.0          # how long a trial's writes wait for a database that restarts
RETRY_S = 1.0

log = logging.getLogger(__name__)
_local = threading.local()


@contextmanager
def patient() -> Iterator[None]:
    """Storage connections opened by this thread wait (up to PATIENCE_S) for a database that is away."""
    before = getattr(_local, "patient", False)
    _local.patient = True
    try:
        yield
    finally:
        _local.patient = before


def wait_to_connect(engine: Engine) -> Engine:
    """Make `engine`'s new connections wait for the server inside `patient()` (not for SQLite: a file
    is never "away"). Returns the engine."""
    if engine.dialect.name == "sqlite" or getattr(engine, "_autotune_patient", False):
        return engine

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        if not getattr(_local, "patient", False):
            return None                         # the dialect connects as usual (fails at once)
        end = time.monotonic() + PATIENCE_S
        warned = False
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as e:
                if time.monotonic() >= end:
                    raise
                if not warned:
                    log.warning("the database is unreachable (%s); waiting up to %.0f s for it",
                                str(e).splitlines()[0], PATIENCE_S)
                    warned = True
                time.sleep(RETRY_S)

    engine._autotune_patient = True  # type: ignore[attr-defined]
    return engine


__all__ = ["PATIENCE_S", "patient", "wait_to_connect"]
