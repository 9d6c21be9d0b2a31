"""Heartbeats are judged by the database's clock; a stale trial is re-queued once, by one process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import text

from autotune.node.heartbeat import Heartbeats
from autotune.store.repository import make_engine


def _backdate(engine, key: str, seconds: int) -> None:
    """Move a row's beat into the past by the DATABASE's clock (SQLite: UTC 'now')."""
    with engine.begin() as conn:
        conn.execute(text("update autotune_heartbeats set beat_at = strftime('%Y-%m-%d %H:%M:%f', 'now', "
                          f"'-{seconds} seconds') where key = :k"), {"k": key})


def test_age_is_the_databases_clock_and_stale_after_the_limit(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/hb.db")
    # stale after 30 s: far longer than a loaded machine takes between the beat and the look
    other = Heartbeats(engine, interval_s=10.0, host="elsewhere")    # another host: only the age counts
    me = Heartbeats(engine, interval_s=10.0, host="here")
    before = time.monotonic()
    other.beat("trial", "1", "s")
    other.beat("trial", "2", "s")
    _backdate(engine, "2", 100)
    ages = me.ages("trial")
    took = time.monotonic() - before                                # the most either age grew meanwhile
    assert 0 <= ages["1"].age_s <= took + 0.01 and 100 - 0.01 <= ages["2"].age_s <= 100 + took + 0.01
    assert me.stale_after_s == 30.0 and me.stale(["1", "2"]) == {"2"}
    other.beat("trial", "2", "s")                                   # a fresh beat makes it live again
    assert me.stale(["1", "2"]) == set()
    with engine.connect() as conn:                                 # stored by the DB, not by Python
        stored = conn.execute(text("select beat_at from autotune_heartbeats where key='1'")).scalar()
        db_now = conn.execute(text("select strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar()
    assert stored[:16] == db_now[:16]


def test_a_missing_row_is_stale_only_after_the_limit_as_the_observer_counts(tmp_path: Path, wait_until) -> None:
    me = Heartbeats(make_engine(f"sqlite:///{tmp_path}/hb.db"), interval_s=0.1, host="here")
    before = time.monotonic()
    assert me.stale(["9"]) == set()                                # first seen missing now
    wait_until(lambda: me.stale(["9"]) == {"9"}, 30, what="the missing row to be judged stale")
    assert time.monotonic() - before >= me.stale_after_s           # ... and not before the limit


def test_an_owner_gone_on_this_host_is_stale_at_once(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/hb.db")
    code = ("import sys; from autotune.store.repository import make_engine; from autotune.node.heartbeat "
            "import Heartbeats; Heartbeats(make_engine(sys.argv[1]), host='here').beat('trial', '5', 's')")
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp_path}/hb.db"], check=True,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    here, there = Heartbeats(engine, interval_s=60, host="here"), Heartbeats(engine, interval_s=60, host="there")
    assert here.stale(["5"]) == {"5"}          # its owner's PID is gone on this host
    assert there.stale(["5"]) == set()         # from another host only the (fresh) age counts


def test_the_thread_beats_tracked_trials_and_stop_removes_the_process(tmp_path: Path, wait_until) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/hb.db")
    hb = Heartbeats(engine, interval_s=0.1, host="here").start()
    hb.track("3", "s")
    _backdate(engine, "3", 100)
    wait_until(lambda: hb.ages("trial")["3"].age_s < 50, 30,       # beaten again by the thread
               what="the thread to beat the tracked trial again")
    # live: beaten within the limit (0.3 s) when looked at, which a starved thread can miss once
    wait_until(lambda: [b.pid for b in hb.live_processes()] == [os.getpid()], 30, what="this process to be live")
    hb.untrack("3")
    hb.stop()
    assert hb.ages("trial") == {} and hb.ages("process") == {}


def test_beats_from_many_threads_keep_one_row(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/hb.db")
    hbs = [Heartbeats(engine, interval_s=1, host=f"h{i}") for i in range(4)]
    threads = [threading.Thread(target=lambda h=h: [h.beat("trial", "7", "s") for _ in range(5)]) for h in hbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with engine.connect() as conn:
        assert conn.execute(text("select count(*) from autotune_heartbeats where key='7'")).scalar() == 1
