"""Process hygiene for servers the tuner starts: own group, log file, parent-death signal, clean stop.

vLLM forks an EngineCore and worker processes; a SIGTERM to the API server alone can leave them
holding memory. So every server gets its own process group (and session), and stopping means
signalling the whole group and then waiting until no member is left. Members that escaped the group
(setsid in a child) are still found as psutil descendants of the leader, snapshotted before the signal.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import psutil

from autotune.prctl import parent_death_signal

def process_create_time(pid: int | None = None) -> float:
    try:
        return psutil.Process(pid or os.getpid()).create_time()
    except psutil.Error:
        return 0.0


def owner_alive_here(pid: int, create_time: float | None) -> bool:
    """For servers recorded on THIS host only: is the autotune process that started them still there?"""
    try:
        proc = psutil.Process(pid)
        if create_time and abs(proc.create_time() - create_time) >= 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass(frozen=True)
class ProcessRecord:
    """Enough to find a process again after a crash, and to be sure it is the same one."""

    pid: int
    pgid: int
    create_time: float


def _child_setup(cores: Sequence[int]) -> Callable[[], None]:
    """The child's pre-exec step: the parent-death signal, and the CPU cores it may run on (its
    children inherit them), so co-running trials do not compete for one core."""
    def setup() -> None:
        parent_death_signal()
        if cores:
            try:
                os.sched_setaffinity(0, cores)
            except OSError:
                pass
    return setup


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, cores: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start argv in a new session (so its own process group), stdout+stderr appended to log_path.

    The parent-death signal fires when the *thread* that called spawn exits, not only the process:
    call it from the main thread or a thread that lives as long as the server should.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_setup(tuple(cores)),
        )


LOG_HEAD_BYTES = 256 * 1024       # the start of a server's log: its banner and startup figures
LOG_TAIL_BYTES = 1024 * 1024      # the end: why it died


def write_log_header(log_path: Path, text: str) -> None:
    """Append autotune's own line to a server log before the launch, flushed to the disk's answer, so a
    log that cannot be written (ENOSPC, a read-only or full device) is an OSError here rather than a
    server writing into the void."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(log_path, "ab") as log:
        log.write(f"# autotune {stamp}: {text}\n".encode())
        log.flush()
        os.fsync(log.fileno())


def read_log(path: Path, offset: int = 0) -> str:
    """What a server wrote from `offset` on, bounded: the first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES
    when there is more. Bounded also because a log may be a device that never ends (a log pointed at
    /dev/full reads back endless NULs); NULs are dropped. "" when the file cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(LOG_HEAD_BYTES + LOG_TAIL_BYTES + 1)
            if len(data) > LOG_HEAD_BYTES + LOG_TAIL_BYTES:
                size = os.fstat(f.fileno()).st_size
                tail = b""
                if size > offset + LOG_HEAD_BYTES + LOG_TAIL_BYTES:  # a regular file: its real end
                    f.seek(size - LOG_TAIL_BYTES)
                    tail = f.read(LOG_TAIL_BYTES)
                data = data[:LOG_HEAD_BYTES] + b"\n[... autotune: log cut here ...]\n" + tail
    except OSError:
        return ""
    return data.replace(b"\x00", b"").decode("utf-8", errors="replace")


def record_of(pid: int) -> ProcessRecord:
    """The (pid, pgid, create_time) triple the runner stores for kill_leftovers."""
    return ProcessRecord(pid=pid, pgid=os.getpgid(pid), create_time=psutil.Process(pid).create_time())


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def _signal_all(pgid: int, procs: Iterable[psutil.Process], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in procs:  # descendants that left the group
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc] + proc.children(recursive=True)
    except psutil.Error:
        return []


def confine(pid: int, cores: Sequence[int]) -> int:
    """Move every thread of a process and of its descendants onto `cores`; returns how many moved.

    Why: the CPU build binds its compute threads only in a worker process it spawns; with its one-process
    executor (the demo's) nothing is bound, and its engine core and HTTP front end ran on the load
    client's core (4.4 s of a 25 s step), so the client stamped its chunks late and flagged itself. Done
    once the server is ready, not at launch: a start squeezed onto one core under load took over five
    minutes. `os.sched_setaffinity` of a pid moves one thread, so each task of /proc is moved; threads
    made later inherit their creator's cores."""
    try:
        procs = _descendants(psutil.Process(pid))
    except psutil.Error:
        return 0
    moved = 0
    for proc in procs:
        try:
            tids = [t.id for t in proc.threads()]
        except psutil.Error:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
                moved += 1
            except OSError:       # ended meanwhile
                continue
    return moved


def _stop(pgid: int, seeds: list[psutil.Process], grace_s: float, popen: subprocess.Popen[bytes] | None) -> None:
    if pgid == os.getpgid(0):
        raise ValueError(f"refusing to signal our own process group {pgid}")
    procs: dict[int, psutil.Process] = {p.pid: p for p in _group_members(pgid)}
    for seed in seeds:
        for proc in _descendants(seed):
            procs.setdefault(proc.pid, proc)
    everyone = list(procs.values())
    _signal_all(pgid, everyone, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = False
    while True:
        if popen is not None:
            popen.poll()  # reap the leader, or it lingers as a zombie
        # Members may fork while shutting down; pick them up too.
        known = {p.pid for p in everyone}
        everyone = _alive(everyone + [p for p in _group_members(pgid) if p.pid not in known])
        if not everyone:
            break
        if time.monotonic() >= deadline:
            if killed:
                break  # unkillable (D state): give up rather than hang the study
            _signal_all(pgid, everyone, signal.SIGKILL)
            killed = True
            deadline = time.monotonic() + 10.0
        time.sleep(0.1)
    if popen is not None:
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def stop_group(pid: int, pgid: int, grace_s: float = 15.0, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the group, SIGKILL what is left after grace_s; return once every member is gone.

    Descendants of pid that left the group (setsid in a child) are snapshotted and signalled too.
    Pass `popen` when this process is the parent, so the leader is reaped rather than left a zombie.
    """
    try:
        seeds = [psutil.Process(pid)]
    except psutil.Error:
        seeds = []
    _stop(pgid, seeds, grace_s, popen)


def kill_leftovers(records: Iterable[ProcessRecord | tuple[int, int, float]],
                   grace_s: float = 10.0) -> list[ProcessRecord]:
    """Stop the groups of servers a killed tuner left behind; returns the records it stopped.

    The leader is signalled only when its create_time matches the record (PIDs get reused). A leader
    that is gone may have left orphans in its group (an EngineCore); those are stopped when they were
    created after the leader was: a process group id cannot be reused while any member is alive.
    """
    stopped = []
    for rec in records:
        record = rec if isinstance(rec, ProcessRecord) else ProcessRecord(*rec)
        seeds: list[psutil.Process] = []
        try:
            proc = psutil.Process(record.pid)
            if abs(proc.create_time() - record.create_time) >= 0.05:
                continue  # the pid (and so the group id) now belongs to someone else
            if proc.status() != psutil.STATUS_ZOMBIE:
                seeds = [proc]
        except psutil.Error:
            pass
        members = [p for p in _alive(_group_members(record.pgid)) if _created_after(p, record.create_time)]
        if record.pgid == os.getpgid(0) or not (seeds or members):
            continue
        _stop(record.pgid, seeds + members, grace_s, None)
        stopped.append(record)
    return stopped


def _created_after(proc: psutil.Process, t: float) -> bool:
    try:
        return proc.create_time() >= t - 0.05
    except psutil.Error:
        return False


LISTEN_LOW = 20000     # the lowest port autotune listens on (below: services' well-known ports)


def listen_range() -> tuple[int, int]:
    """[low, high) of the ports autotune's servers listen on: below the kernel's ephemeral range, which
    every outgoing connection draws its local port from. Why: a port the OS hands out as free (bind to 0)
    lies in that range, and between the choice and the server's bind a load client's new connection
    could take it. Falls back to [20000, 60000) when the ephemeral range leaves no room below it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return (LISTEN_LOW, low) if low - LISTEN_LOW >= 4096 else (LISTEN_LOW, 60000)


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to now, outside the ephemeral range (listen_range); a race with another
    chooser remains until the server binds, and the runner retries a taken port."""
    lo, hi = listen_range()
    start = random.randrange(lo, hi)
    for i in range(hi - lo):
        port = lo + (start - lo + i) % (hi - lo)
        if port_free(port, host, reuse=False):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:   # every one taken: the OS's choice
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1", reuse: bool = True) -> bool:
    """Whether a server could bind `port` now (with SO_REUSEADDR, as servers do, unless `reuse` is off:
    then a port that a closing connection still holds counts as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_port_free(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> bool:
    """True once nothing listens on port; False at timeout (the caller decides whether that is fatal)."""
    deadline = time.monotonic() + timeout
    while True:
        if port_free(port, host):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
