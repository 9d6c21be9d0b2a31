"""Signals and the invocation's deadline become `Interrupted` in the main thread, and nothing on the
way down (HTTP clients catching Exception around a request) can swallow it."""

import asyncio
import os
import signal
import time

import pytest

from autotune.node.interrupts import Interrupted, _interrupts


async def _guarded_work(seconds: float) -> str:
    """Like a load generator's request: every Exception is counted as a failed request."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            await asyncio.sleep(0.01)
        except Exception:
            return "swallowed"
    return "finished"


@pytest.mark.parametrize("sig,reason", [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")])
def test_signal_inside_the_event_loop_reaches_the_study(sig, reason):
    # "restored" is whatever the process had before: a shell that starts a job in the background
    # without job control hands it SIGINT ignored, and the handlers must come back as that
    before = signal.getsignal(sig)
    with _interrupts(loop=None, deadline=None):  # type: ignore[arg-type]
        with pytest.raises(Interrupted) as caught:
            async def main():
                asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), sig)
                return await _guarded_work(60)
            asyncio.run(main())
    assert caught.value.reason == reason
    assert signal.getsignal(sig) == before    # handlers restored


def test_deadline_interrupts_a_blocking_wait():
    with _interrupts(loop=None, deadline=time.monotonic() + 0.3):  # type: ignore[arg-type]
        with pytest.raises(Interrupted) as caught:
            time.sleep(60)
    assert caught.value.reason == "timeout"


def _interrupt_worker(main, reason: str) -> tuple[list[str], float]:
    """Run `main(ready)` through run_async in a worker thread with a gate, interrupt it once it has set
    `ready` (a threading.Event); returns the reasons the worker caught and the seconds from the interrupt
    to the worker's end."""
    import threading

    from autotune.node.interrupts import Gate, interruptible, run_async, set_gate

    caught: list[str] = []
    ready = threading.Event()

    def worker(gate: Gate) -> None:
        set_gate(gate)
        try:
            with interruptible():
                run_async(main(ready))
        except Interrupted as e:
            caught.append(e.reason)

    gate = Gate()
    thread = threading.Thread(target=worker, args=(gate,))
    thread.start()
    assert ready.wait(60), "the worker's event loop never got going"
    t0 = time.monotonic()
    gate.interrupt(reason)
    thread.join(timeout=60)
    return caught, time.monotonic() - t0


def test_a_worker_thread_is_interrupted_inside_an_asyncio_task_without_noise(capsys):
    """The scheduler's way in: an interrupt of a worker thread running an event loop cancels its main
    task (tasks nobody awaits included), arrives as Interrupted, and asyncio logs nothing."""
    import gc

    async def spin() -> None:
        while True:
            sum(range(2000))
            await asyncio.sleep(0)

    async def main(ready) -> None:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(spin()) for _ in range(4)]  # noqa: F841 - fire and forget
        await asyncio.sleep(0)                                 # the tasks are running
        ready.set()
        await asyncio.sleep(30)

    caught, took = _interrupt_worker(main, "SIGTERM")
    gc.collect()
    assert caught == ["SIGTERM"] and took < 10                 # at once, not after the 30 s sleep
    assert "Traceback" not in capsys.readouterr().err


def test_asyncio_logs_nothing_for_an_expected_interrupt_but_still_logs_errors(caplog):
    import logging

    import autotune.node.interrupts  # noqa: F401 - installs the filter

    log = logging.getLogger("asyncio")
    log.error("Task exception was never retrieved", exc_info=(Interrupted, Interrupted("SIGTERM"), None))
    log.error("Task exception was never retrieved", exc_info=(ValueError, ValueError("real"), None))
    assert [r.exc_info[0] for r in caplog.records] == [ValueError]


def test_a_cancellation_swallowed_on_the_way_is_escalated(monkeypatch):
    """Code that catches CancelledError (awaiting a task it cancelled) must not keep a trial running."""
    from autotune.node.interrupts import Gate

    monkeypatch.setattr(Gate, "ESCALATE_S", 0.3)

    async def stubborn(ready) -> None:
        ready.set()
        try:                        # like a load step awaiting a task it cancelled itself
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
        await asyncio.sleep(30)     # ... and going on to the next step

    caught, took = _interrupt_worker(stubborn, "SIGINT")
    assert caught == ["SIGINT"] and 0.25 < took < 10          # escalated after ESCALATE_S, not after 30 s
