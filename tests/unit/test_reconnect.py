"""Only a trial's worker thread waits for a database that is away (store/reconnect.py): a command given
a wrong URL still fails at once. A closed loopback port stands in for a server that is restarting."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

import autotune.store.reconnect as reconnect
from autotune.store.repository import make_engine


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _try(engine) -> tuple[int, float]:
    """One use of `engine` against the closed port: (connection attempts, seconds) until it failed."""
    attempts = []
    real = engine.dialect.connect
    engine.dialect.connect = lambda *a, **kw: attempts.append(1) or real(*a, **kw)
    t0 = time.monotonic()
    try:
        with pytest.raises(OperationalError, match="refused"):
            with engine.connect() as conn:
                conn.execute(text("select 1"))
    finally:
        engine.dialect.connect = real
    return len(attempts), time.monotonic() - t0


def test_only_patient_threads_wait_and_only_as_long_as_the_patience(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("psycopg")
    monkeypatch.setattr(reconnect, "PATIENCE_S", 0.6)
    monkeypatch.setattr(reconnect, "RETRY_S", 0.1)
    engine = make_engine(f"postgresql+psycopg://autotune@127.0.0.1:{_closed_port()}/x")
    assert _try(engine)[0] == 1                                  # a CLI command: one attempt, fails at once
    with caplog.at_level(logging.WARNING, logger="autotune.store.reconnect"), reconnect.patient():
        attempts, waited = _try(engine)
    assert attempts >= 2 and 0.6 <= waited < 30                  # retried for the patience, then gave up
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1   # said once, not per retry
    assert _try(engine)[0] == 1                                  # patience ends with the block
    assert make_engine("sqlite://").dialect.name == "sqlite"     # SQLite is left as it is
