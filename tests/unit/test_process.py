"""Process-group hygiene with real processes: nothing a test starts may outlive it."""

import os
import re
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from autotune.engine.process import (
    ProcessRecord,
    find_free_port,
    kill_leftovers,
    listen_range,
    record_of,
    spawn,
    stop_group,
    wait_port_free,
)

# A leader that forks: one child stays in the group and ignores SIGTERM, one leaves it with setsid.
TREE = textwrap.dedent("""
    import os, signal, sys, time
    pids = []
    for escape in (False, True):
        # the ignoring child inherits SIG_IGN at fork, so it ignores SIGTERM before the test can send one
        signal.signal(signal.SIGTERM, signal.SIG_DFL if escape else signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            if escape:
                os.setsid()
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print("children", *pids, flush=True)
    time.sleep(60)
""")


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def children_from_log(path: Path) -> list[int]:
    """The tree's line, once whole: the suite runs with PYTHONUNBUFFERED=1 (tests/streams.py), under which
    print writes each piece with its own write(), and a read between them once saw "children" alone."""
    line = re.compile(r"^children( \d+)+\n", re.M)
    assert wait_for(lambda: line.search(path.read_text()) is not None), path.read_text()
    return [int(p) for p in line.search(path.read_text()).group(0).split()[1:]]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_spawn_gives_own_group_and_writes_both_streams_to_the_log(tmp_path):
    log = tmp_path / "trial.log"
    code = ("import os, sys; print('out', os.getpgid(0) == os.getpid() == os.getsid(0), os.environ['X']); "
            "print('err', file=sys.stderr)")
    log.write_text("earlier\n")
    proc = spawn([sys.executable, "-c", code], log, env={**os.environ, "X": "x1"})
    assert proc.wait(timeout=10) == 0
    assert log.read_text().split() == ["earlier", "out", "True", "x1", "err"]  # appended, both streams


def test_stop_group_takes_the_whole_tree_incl_term_ignorers_and_escapees(tmp_path):
    log = tmp_path / "tree.log"
    proc = spawn([sys.executable, "-c", TREE], log)
    kids = children_from_log(log)
    assert os.getpgid(proc.pid) == proc.pid
    assert os.getpgid(kids[0]) == proc.pid and os.getpgid(kids[1]) == kids[1]  # second one escaped
    started = time.monotonic()
    stop_group(proc.pid, proc.pid, grace_s=0.5, popen=proc)
    took = time.monotonic() - started
    assert all(gone(pid) for pid in [proc.pid, *kids])
    assert 0.5 <= took < 30  # the SIGTERM-ignoring child forced the SIGKILL after the grace, not its 60 s
    assert proc.returncode is not None  # the leader was reaped, not left a zombie
    stop_group(proc.pid, proc.pid, grace_s=0.5, popen=proc)  # already gone: a no-op, no error


def test_stop_group_refuses_our_own_group():
    with pytest.raises(ValueError):
        stop_group(os.getpid(), os.getpgid(0), grace_s=0.1)


def test_parent_death_signal_stops_the_server_when_the_tuner_is_sigkilled(tmp_path):
    pidfile = tmp_path / "server.pid"
    tuner = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from autotune.engine.process import spawn
        p = spawn([sys.executable, "-c", "import time; time.sleep(60)"], Path({str(tmp_path / 's.log')!r}))
        Path({str(pidfile)!r}).write_text(str(p.pid))
        time.sleep(60)
    """)
    outer = spawn([sys.executable, "-c", tuner], tmp_path / "tuner.log")
    try:
        assert wait_for(lambda: pidfile.exists() and pidfile.read_text()), (tmp_path / "tuner.log").read_text()
        server = int(pidfile.read_text())
        assert not gone(server)
        os.kill(outer.pid, signal.SIGKILL)
        outer.wait(timeout=60)
        assert wait_for(lambda: gone(server))
    finally:
        stop_group(outer.pid, outer.pid, grace_s=0.5, popen=outer)


def test_kill_leftovers_stops_exactly_the_recorded_groups(tmp_path):
    a = spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "a.log")
    b = spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "b.log")
    try:
        rec_a = record_of(a.pid)
        rec_b = record_of(b.pid)
        reused = ProcessRecord(b.pid, b.pid, rec_b.create_time - 100.0)  # same pid, another process
        stopped = kill_leftovers([rec_a, (reused.pid, reused.pgid, reused.create_time), (999_999_9, 999_999_9, 1.0)],
                                 grace_s=1.0)
        assert stopped == [rec_a]
        a.wait(timeout=60)
        assert b.poll() is None  # untouched: create_time did not match
    finally:
        for p in (a, b):
            stop_group(p.pid, p.pid, grace_s=0.5, popen=p)


def test_kill_leftovers_finds_orphans_of_a_dead_leader(tmp_path):
    log = tmp_path / "tree.log"
    proc = spawn([sys.executable, "-c", TREE], log)
    kids = children_from_log(log)
    rec = record_of(proc.pid)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert not gone(kids[0])  # the in-group child outlived its leader
        assert kill_leftovers([rec], grace_s=0.3) == [rec]
        assert wait_for(lambda: gone(kids[0]))
    finally:
        stop_group(kids[1], kids[1], grace_s=0.3)  # the escapee has its own group


def test_free_ports_are_chosen_below_the_ephemeral_range_that_client_connections_use():
    lo, hi = listen_range()
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert lo == 20000 and (hi == ephemeral_low or ephemeral_low - 20000 < 4096)
    taken = []
    try:
        for _ in range(20):
            port = find_free_port()
            assert lo <= port < hi and port not in [s.getsockname()[1] for s in taken]
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))         # each really was free; held, so the next must differ
            taken.append(sock)
    finally:
        for sock in taken:
            sock.close()


def test_find_free_port_and_wait_port_free():
    port = find_free_port()
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    listener.listen()
    try:
        started = time.monotonic()
        assert wait_port_free(port, timeout=0.5) is False
        assert time.monotonic() - started >= 0.5
    finally:
        listener.close()
    assert wait_port_free(port, timeout=2.0) is True


def test_read_log_is_bounded_even_on_a_device_that_never_ends(tmp_path):
    from autotune.engine.process import LOG_HEAD_BYTES, LOG_TAIL_BYTES, read_log

    assert read_log(Path("/dev/full")).strip() == "[... autotune: log cut here ...]"   # endless NULs, bounded
    big = tmp_path / "big.log"
    big.write_bytes(b"BANNER\n" + b"x" * (3 * LOG_TAIL_BYTES) + b"\nValueError: the root cause\n")
    text = read_log(big)
    assert text.startswith("BANNER") and text.endswith("ValueError: the root cause\n")
    assert "[... autotune: log cut here ...]" in text and len(text) < LOG_HEAD_BYTES + LOG_TAIL_BYTES + 100
    assert read_log(big, offset=big.stat().st_size - 5) == "ause\n"
    assert read_log(tmp_path / "missing.log") == ""
