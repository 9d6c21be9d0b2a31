"""Signals and the invocation's deadline become `Interrupted` in the main thread, and nothing on the
way down (HTTP clients catching Exception around a request) can swallow it."""

import asyncio
import os
import signal
import time

import pytest

from autotune.tuner.study import Interrupted, _interrupts


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
    with _interrupts(loop=None, deadline=None):  # type: ignore[arg-type]
        with pytest.raises(Interrupted) as caught:
            async def main():
                asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), sig)
                return await _guarded_work(5)
            asyncio.run(main())
    assert caught.value.reason == reason
    assert signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL)  # handlers restored


def test_deadline_interrupts_a_blocking_wait():
    with _interrupts(loop=None, deadline=time.monotonic() + 0.3):  # type: ignore[arg-type]
        with pytest.raises(Interrupted) as caught:
            time.sleep(5)
    assert caught.value.reason == "timeout"
