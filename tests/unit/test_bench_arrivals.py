"""Arrival statistics and the closed/open loops' behaviour, on asyncio's clock without a server."""

import asyncio
import time

import numpy as np
import pytest

from autotune.bench.arrivals import ClosedLoop, OpenLoop
from autotune.bench.workloads import Prompt


def test_poisson_intervals_have_mean_one_over_rate_and_cv_one():
    gaps = OpenLoop(rate=50.0, burstiness=1.0, seed=1).intervals(20001)[1:]
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_cv(burstiness):
    gaps = OpenLoop(rate=10.0, burstiness=burstiness, seed=2).intervals(20001)[1:]
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)


def test_arrivals_are_seeded():
    a, b = OpenLoop(5.0, seed=3).intervals(100), OpenLoop(5.0, seed=3).intervals(100)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, OpenLoop(5.0, seed=4).intervals(100))
    assert a[0] == 0.0                                # first request goes at once


def test_infinite_rate_sends_everything_at_once():
    assert not OpenLoop(float("inf")).intervals(10).any()


async def test_closed_loop_holds_exact_concurrency():
    in_flight = peak = 0
    sent = []

    async def send(p: Prompt, scheduled: float | None = None) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        sent.append(p)
        await asyncio.sleep(0.005)
        in_flight -= 1

    prompts = iter([Prompt("x", 1)] * 40)
    await ClosedLoop(4).drive(prompts, send, deadline=None, stop=asyncio.Event())
    assert len(sent) == 40 and peak == 4


async def test_open_loop_sends_at_the_rate_and_respects_deadline():
    due_at = []

    async def send(p: Prompt, scheduled: float | None = None) -> None:
        due_at.append(scheduled)

    deadline = time.perf_counter() + 0.5
    loop = OpenLoop(rate=200.0, seed=5)
    await loop.drive(iter([Prompt("x", 1)] * 10_000), send, deadline=deadline, stop=asyncio.Event())
    # every request the seeded schedule holds before the deadline is sent, and none after it. Checked on
    # the schedule each send was given, not on when the send ran: a busy machine may run sends late
    n = len(due_at)
    due = due_at[0] + np.cumsum(OpenLoop(rate=200.0, seed=5).intervals(n + 1))
    assert due_at == pytest.approx(list(due[:n]), abs=1e-9) and due_at[-1] < deadline <= due[n]
    # about 100 arrivals in 0.5 s (Poisson: +-3 sigma = +-30) in this seed's schedule
    assert 70 <= int((np.cumsum(OpenLoop(rate=200.0, seed=5).intervals(1000)) < 0.5).sum()) <= 130


async def test_open_loop_cap_limits_in_flight():
    in_flight = peak = 0

    async def send(p: Prompt, scheduled: float | None = None) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1

    await OpenLoop(rate=float("inf"), cap=3).drive(iter([Prompt("x", 1)] * 12), send, deadline=None,
                                                   stop=asyncio.Event())
    assert peak == 3


def test_exact_n_offers_exactly_the_rate_and_keeps_the_shape():
    loop = OpenLoop(rate=40.0, seed=0, exact_n=200)
    gaps = loop.intervals(200)
    assert gaps[1:].sum() == pytest.approx(199 / 40.0)
    raw = OpenLoop(rate=40.0, seed=0).intervals(200)
    assert np.corrcoef(gaps[1:], raw[1:])[0, 1] == pytest.approx(1.0)   # same draws, rescaled
    assert len(loop.intervals(300)) == 300                                 # and it goes on past n
