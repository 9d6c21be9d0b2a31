"""How a trial is stopped in the middle: signals and the deadline reach the main thread as
`Interrupted`; the scheduler passes them on to each job thread through its `Gate`.

A job thread is interrupted by raising `Interrupted` inside it (CPython's PyThreadState_SetAsyncExc),
so a trial stops wherever it is, e.g. while its server starts, the same way Ctrl-C stops the main
thread. The gate is armed only while the runner holds a started, registered server inside its
try/finally: an exception can then never land between a fork and its bookkeeping, nor inside the
server's stop, and at most one is ever sent. While the job thread waits for its measurement worker
(node/worker.py), the gate instead calls a canceller (`cancelling`: the worker is told to stop and
answers), and once the measurement has arrived the gate is `settle`d: a completed measurement is never
thrown away by an interrupt that comes after it. In the worker process a gate of its own cancels the
load's event loop (`run_async`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")


class Interrupted(KeyboardInterrupt):
    """The invocation was stopped (signal or timeout); `reason` says which. A KeyboardInterrupt, so
    that no `except Exception` on the way (an HTTP client counting a failed request) can swallow it,
    and asyncio stops its loop at once instead of parking it in a task."""

    def __init__(self, reason: str = "interrupted"):
        super().__init__(reason)
        self.reason = reason


class _ExpectedInterrupt(logging.Filter):
    """An interrupt that lands inside an asyncio task (an HTTP request of the load) leaves that task
    with an exception nobody retrieves, and asyncio logs it with a traceback when the task is collected.
    The interrupt was expected and the trial is recorded as interrupted: that log line is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, Interrupted)


logging.getLogger("asyncio").addFilter(_ExpectedInterrupt())

_classes: dict[str, type[Interrupted]] = {}


def _interrupted_class(reason: str) -> type[Interrupted]:
    """An async exception is raised from its class: one subclass per reason carries the reason."""
    if reason not in _classes:
        def __init__(self: Interrupted, *args: Any) -> None:
            Interrupted.__init__(self, reason)
        _classes[reason] = type(f"Interrupted_{len(_classes)}", (Interrupted,), {"__init__": __init__})
    return _classes[reason]


def _async_raise(thread_id: int, exc: type[BaseException] | None) -> int:
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                      ctypes.py_object(exc) if exc is not None else None)


class Gate:
    """One per job thread (and one in each measurement worker). `interrupt` may be called from any thread, any number of times.

    While the thread runs an event loop through `run_async`, an interrupt cancels the loop's main task
    (every request and session then closes in order) and `run_async` raises Interrupted; if the thread
    is still inside the armed block ESCALATE_S later (code on the way swallowed the cancellation), or
    at once when no loop runs (waiting for the server's /health), Interrupted is raised in the thread."""

    ESCALATE_S = 3.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tid: int | None = None
        self._raised = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._timer: threading.Timer | None = None
        self._cancel: Callable[[str], None] | None = None
        self._cancelled = False
        self._settled = False
        self.reason: str | None = None

    def interrupt(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            self._send()

    def _send(self) -> None:
        if self._tid is None or self.reason is None or self._raised or self._settled:
            return
        if self._cancel is not None:         # the waiter raises once the canceller's side has answered
            if not self._cancelled:
                self._cancelled = True
                self._cancel(self.reason)
            return
        if self._loop is not None and self._task is not None:
            if self._timer is None:
                try:
                    self._loop.call_soon_threadsafe(self._task.cancel)
                except RuntimeError:            # the loop just closed: raise in the thread instead
                    self._raise()
                    return
                self._timer = threading.Timer(self.ESCALATE_S, self._escalate)
                self._timer.daemon = True
                self._timer.start()
            return
        self._raise()

    def _raise(self) -> None:
        assert self._tid is not None and self.reason is not None
        self._raised = True
        _async_raise(self._tid, _interrupted_class(self.reason))

    def _escalate(self) -> None:
        with self._lock:
            if self._tid is not None and not self._raised and not self._settled:
                self._raise()
                if self._loop is not None:      # a thread blocked in select() runs no bytecode: wake it
                    try:
                        self._loop.call_soon_threadsafe(lambda: None)
                    except RuntimeError:
                        pass

    def cancelling(self, cancel: Callable[[str], None]) -> "_cancelling":
        """`with gate.cancelling(fn):` while the armed thread waits on something that can be told to stop
        (the measurement worker): an interrupt calls `fn(reason)` once, from the interrupting thread,
        instead of raising here; the waiter sees the answer and raises Interrupted itself."""
        return _cancelling(self, cancel)

    def settle(self) -> None:
        """What this thread waited for has completed (the measurement arrived): from now on an interrupt
        is noted (`reason`, `check()`) but not delivered here, and one sent but not yet delivered is
        withdrawn."""
        with self._lock:
            self._settled = True
            self._cancel = None
            if self._timer is not None:
                self._timer.cancel()
            if self._tid is not None and self._raised:
                _async_raise(self._tid, None)

    def check(self) -> None:
        """Raise at once if an interrupt was asked for (call before starting anything costly)."""
        if self.reason is not None:
            raise Interrupted(self.reason)

    def attach(self, loop: asyncio.AbstractEventLoop | None, task: asyncio.Task[Any] | None) -> None:
        """`run_async` registers its loop and main task (None, None when it ends)."""
        with self._lock:
            self._loop, self._task = loop, task
            if task is not None:
                self._send()

    def __enter__(self) -> "Gate":
        with self._lock:
            self._tid = threading.get_ident()
            self._settled = False           # armed again (the next repeat of a confirmation): a new wait
            self._send()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            if self._tid is not None and self._raised:
                _async_raise(self._tid, None)   # clear one sent but not yet delivered
            if self._timer is not None:
                self._timer.cancel()
            self._tid = None


class _cancelling:
    def __init__(self, gate: Gate, cancel: Callable[[str], None]) -> None:
        self.gate, self.cancel = gate, cancel

    def __enter__(self) -> None:
        with self.gate._lock:
            self.gate._cancel, self.gate._cancelled = self.cancel, False
            self.gate._send()

    def __exit__(self, *exc: Any) -> None:
        with self.gate._lock:
            self.gate._cancel = None


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, interruptible by this thread's gate: the interrupt cancels the main task, so the
    load's requests and HTTP sessions close in order, and arrives here as Interrupted. A coroutine that
    completed is returned even when an interrupt came after its end (its result is a measurement)."""
    gate = current_gate()
    if gate is None:
        return asyncio.run(coro)

    async def main() -> T:
        gate.attach(asyncio.get_running_loop(), asyncio.current_task())
        try:
            return await coro
        finally:
            gate.attach(None, None)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if gate.reason is not None:
            raise Interrupted(gate.reason) from None
        raise


_local = threading.local()


def current_gate() -> Gate | None:
    """The gate of this worker thread (None in the main thread and outside the scheduler)."""
    return getattr(_local, "gate", None)


def set_gate(gate: Gate | None) -> None:
    _local.gate = gate


class interruptible:
    """`with interruptible():` arms this thread's gate, if it has one, for the block."""

    def __enter__(self) -> None:
        gate = current_gate()
        if gate is not None:
            gate.__enter__()

    def __exit__(self, *exc: Any) -> None:
        gate = current_gate()
        if gate is not None:
            gate.__exit__(*exc)


class _interrupts:
    """Turn SIGINT, SIGTERM and the deadline into `Interrupted` in the main thread."""

    def __init__(self, loop: Any, deadline: float | None):
        self.loop = loop
        self.deadline = deadline
        self.reason: str | None = None
        self._timer: threading.Timer | None = None

    def _raise(self, reason: str) -> None:
        self.reason = reason
        raise Interrupted(reason)

    def __enter__(self) -> "_interrupts":
        self._old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGINT, lambda *_: self._raise("SIGINT"))
        signal.signal(signal.SIGTERM, lambda *_: self._raise("SIGTERM"))
        if self.deadline is not None:
            self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()),
                                          lambda: os.kill(os.getpid(), signal.SIGUSR1))
            signal.signal(signal.SIGUSR1, lambda *_: self._raise("timeout"))
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        for s, h in self._old.items():
            signal.signal(s, h)
