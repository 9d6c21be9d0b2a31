"""The daemon's main loop against its scheduler thread, with the race that once ended a clean SIGTERM
with exit 1 made to happen every time: the signal arrives during a poll, the scheduler returns on it,
and only then does the loop look at the thread."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from autotune.daemon import service
from autotune.daemon.service import Daemon


def _daemon(tmp_path: Path) -> Daemon:
    d = Daemon(f"sqlite:///{tmp_path}/d.db", [0], listen="127.0.0.1:8321", token=None, grace_s=1.0,
               log_root=tmp_path / "logs", poll_s=0.01)
    d.listen_port = 0     # any free port: the status API is not what is tested
    return d


def _join_scheduler() -> None:
    """Until the scheduler's thread has ended (it is gone from the list once it has)."""
    for t in threading.enumerate():
        if t.name == "scheduler":
            t.join()


def test_a_signal_during_a_poll_that_ends_the_scheduler_is_a_shutdown_not_a_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(service.Scheduler, "serve", lambda self, stop, grace_s: stop.wait())
    d = _daemon(tmp_path)
    polls: list[bool] = []

    def poll(take_new: bool = True) -> None:
        polls.append(take_new)
        if len(polls) == 1:
            d._on_signal(signal.SIGTERM, None)     # as the handler does, between two looks at the thread
            _join_scheduler()              # the scheduler has returned on it before the loop looks

    monkeypatch.setattr(d, "_poll", poll)
    assert d.run() == 0
    out = capsys.readouterr().out
    assert "SIGTERM: draining" in out and "drained; exiting" in out
    assert "stopped unexpectedly" not in out
    assert polls[0] is True and polls[1:] == [False]     # the drain's last look takes nothing new


def test_a_scheduler_that_dies_on_its_own_is_said_and_ends_the_daemon_with_1(tmp_path, monkeypatch, capsys):
    def serve(self, stop, grace_s):
        raise RuntimeError("a bug in the scheduler")

    monkeypatch.setattr(service.Scheduler, "serve", serve)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)   # the thread's traceback is not the test's
    d = _daemon(tmp_path)
    monkeypatch.setattr(d, "_poll", lambda take_new=True: _join_scheduler())
    assert d.run() == 1
    assert "the scheduler stopped unexpectedly; exiting" in capsys.readouterr().out


@pytest.fixture(autouse=True)
def _signals_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    assert {s: signal.getsignal(s) for s in before} == before    # run() puts the handlers back
