"""A measurement in its own process: one spawned worker per leased trial, pinned to the lease's cores.

Why a process: a trial's load client and its telemetry sampler are CPU-bound Python. As threads of one
daemon they share one interpreter lock, so on a node of eight servers one core measured them all and
every trial read as `client_saturated` (issue 22). A worker is a clean interpreter started with the
multiprocessing "spawn" context (a fork of a threaded daemon could inherit a held lock) and it holds
nothing that outlives its trial.

The child, before it imports its target: asks for SIGKILL when the thread that started it dies (the
daemon's job thread, and so the daemon), checks that this parent is still there, names itself
`autotune-worker`, ignores SIGINT (a terminal's Ctrl-C reaches the whole foreground group: the
daemon decides and tells the worker to stop) and pins itself to its cores. Then it runs
`target(channel)`, where target is "module:function".

Messages are JSON objects with a `kind`, one per frame, over a `multiprocessing.Pipe`. This layer owns
`{"kind": "stop", "reason": ...}` (parent to child); what else is said is the target's (tuner/measure.py).

    >>> w = Worker("autotune.tuner.measure:serve", cores=(2, 3)).start()      # doctest: +SKIP
    >>> w.send(request); msg = w.poll(0.5)                                   # doctest: +SKIP
    >>> w.close()                                                            # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any, Sequence

from autotune.prctl import parent_death_signal, set_name

PROCESS_NAME = "autotune-worker"     # what `ps -o comm` and psutil's name() show
_CONTEXT = multiprocessing.get_context("spawn")


class WorkerDied(RuntimeError):
    """The worker ended without its final message: killed, out of memory, or crashed in C."""

    def __init__(self, pid: int | None, exitcode: int | None) -> None:
        self.pid, self.exitcode = pid, exitcode
        if exitcode is not None and exitcode < 0:
            try:
                how = f"was killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"was killed by signal {-exitcode}"
        elif exitcode is not None:
            how = f"exited with code {exitcode}"
        else:
            how = "closed its pipe"
        super().__init__(f"measurement worker (pid {pid}) {how} before it reported")


def _encode(message: Any) -> bytes:
    """A pydantic model (its own JSON) or a plain dict. (Not importing pydantic here keeps the worker's
    first steps, before its parent-death signal is set, short.)"""
    if hasattr(message, "model_dump_json"):
        return message.model_dump_json().encode()
    return json.dumps(message).encode()


class Channel:
    """The child's end of the pipe: messages in (`recv`, EOFError once the parent is gone), out (`send`,
    safe from any thread of the child)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        data = _encode(message)
        with self._lock:
            self._conn.send_bytes(data)

    def recv(self) -> dict[str, Any]:
        return json.loads(self._conn.recv_bytes())


class Worker:
    """The parent's handle on one worker process. `send`, `request_stop` and `close` may be called from
    any thread; `poll` from one (the job thread that waits for the measurement)."""

    def __init__(self, target: str, *, cores: Sequence[int] = ()) -> None:
        self.target = target
        self.cores = tuple(cores)
        self._conn: Connection | None = None
        self._process: Any = None
        self._send_lock = threading.Lock()
        self.stop_sent = False
        self.asked = False          # a request was sent: on close, it gets time to answer a stop

    def start(self) -> "Worker":
        """Spawn the process (returns at once; the child boots beside whatever the caller does next)."""
        parent, child = _CONTEXT.Pipe(duplex=True)
        self._process = _CONTEXT.Process(target=_child_main, name=PROCESS_NAME, daemon=True,
                                         args=(child, self.target, self.cores, os.getpid()))
        self._process.start()
        child.close()
        self._conn = parent
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def send(self, message: Any) -> None:
        """A pydantic model or a dict; raises WorkerDied when the worker is gone."""
        self.asked = True
        self._send(message)

    def _send(self, message: Any) -> None:
        assert self._conn is not None, "start() first"
        try:
            with self._send_lock:
                self._conn.send_bytes(_encode(message))
        except (OSError, ValueError):
            raise self._died() from None

    def request_stop(self, reason: str) -> None:
        """Ask the worker to stop (it answers with its own final message); a worker already gone is fine."""
        self.stop_sent = True
        try:
            self._send({"kind": "stop", "reason": reason})
        except WorkerDied:
            pass

    def poll(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None after `timeout` seconds; WorkerDied once the process has ended
        and nothing it sent is left to read."""
        assert self._conn is not None, "start() first"
        try:
            if self._conn.poll(timeout):
                return json.loads(self._conn.recv_bytes())
            if not self._process.is_alive():
                if self._conn.poll(0):      # its last words arrived as it exited
                    return json.loads(self._conn.recv_bytes())
                raise self._died()
        except (EOFError, OSError):
            raise self._died() from None
        return None

    def _died(self) -> WorkerDied:
        if self._process is not None:
            self._process.join(timeout=5)
        return WorkerDied(self.pid, self._process.exitcode if self._process is not None else None)

    def close(self, grace_s: float = 5.0) -> None:
        """Stop the worker (asked first, killed after `grace_s`; at once when it was never asked for
        anything: it holds nothing) and reap it. Safe to call twice."""
        if self._process is None:
            return
        if self._process.is_alive() and self.asked:
            self.request_stop("closed")
            self._process.join(timeout=grace_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        if self._process.exitcode is not None:
            self._process.close()
        self._process = None


def _child_main(conn: Connection, target: str, cores: tuple[int, ...], parent_pid: int) -> None:
    """The worker process's first code (runs in the spawned child)."""
    parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:          # the parent died before the signal was asked for
        os._exit(1)
    set_name(PROCESS_NAME)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError:
            pass
    module, _, function = target.partition(":")
    try:
        getattr(importlib.import_module(module), function)(Channel(conn))
    except Exception:
        # the tuner died (SIGKILL, OOM): the kernel closes its end of the pipe before it sends the
        # parent-death signal, so the worker can meet the broken channel first; nobody is left to
        # report to, and a traceback half-printed into the user's terminal before the signal lands is noise
        if os.getppid() != parent_pid:
            os._exit(1)
        raise


__all__ = ["Channel", "PROCESS_NAME", "Worker", "WorkerDied"]
