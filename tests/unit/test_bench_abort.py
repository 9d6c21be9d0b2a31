"""Early abort: certain and statistical rules, censored in-flight requests, no abort on a healthy step."""

import numpy as np

from autotune.bench.abort import EarlyAbort, certain_violators_needed, wilson_lower
from autotune.bench.client import Live
from autotune.bench.results import RequestRecord
from autotune.slo import SLO


def rec(ttft, e2el=500.0, n_out=10, ok=True):
    return RequestRecord(0.0, ttft if ok else None, e2el if ok else None, [], 1, n_out if ok else 0, ok)


def test_certain_threshold_forces_the_percentile_over():
    for n, p in [(200, 99.0), (200, 50.0), (37, 90.0), (1000, 99.9)]:
        k = certain_violators_needed(n, p)
        base = np.zeros(n)
        base[-k:] = 10.0                       # k violators
        assert np.percentile(base, p) > 0
        base[-k] = 0.0                          # one fewer may not be enough
        assert np.percentile(base, p) <= 10.0
    assert certain_violators_needed(200, 99.0) == 3


def test_wilson_lower_bound():
    assert wilson_lower(0, 50) == 0.0
    assert 0.25 < wilson_lower(25, 50) < 0.5
    assert wilson_lower(1000, 1000) > 0.98


def test_p99_ttft_aborts_on_three_failures_of_200():
    a = EarlyAbort(SLO.parse("ttft:p99<=100ms"), total=200)
    done = [rec(50.0) for _ in range(10)] + [rec(0, ok=False)] * 2
    assert a.check(done, [], now=0.0) is None
    assert "3 of 200" in a.check(done + [rec(0, ok=False)], [], now=0.0)


def test_in_flight_requests_past_the_ttft_limit_count():
    a = EarlyAbort(SLO.parse("ttft:p99<=100ms"), total=200)
    waiting = [Live(start=0.0) for _ in range(3)]            # no token after 0.5 s
    assert a.check([], waiting, now=0.05) is None            # not yet past 100 ms
    assert a.check([], waiting, now=0.5) is not None
    streaming = [Live(start=0.0, first=0.01) for _ in range(3)]
    assert a.check([], streaming, now=0.5) is None           # they got their first token in time


def test_clear_statistical_abort_for_a_median_term():
    slo = SLO.parse("tpot:p50<=20ms")
    a = EarlyAbort(slo, total=200, min_samples=20)
    slow = [rec(10.0, e2el=10.0 + 9 * 30.0) for _ in range(30)]      # tpot 30 ms
    assert a.check(slow[:19], [], now=0.0) is None                    # below min_samples
    assert "30 of 30" in a.check(slow, [], now=0.0)
    mixed = [rec(10.0, e2el=10.0 + 9 * 30.0) for _ in range(16)] + [rec(10.0, e2el=10.0 + 9 * 10.0)] * 14
    assert a.check(mixed, [], now=0.0) is None                        # 53 % over: not clear yet


def test_healthy_step_never_aborts():
    rng = np.random.default_rng(0)
    a = EarlyAbort(SLO.parse("ttft:p99<=100ms,tpot:p50<=20ms"), total=200)
    done = []
    for _ in range(200):
        done.append(rec(float(rng.uniform(10, 60)), e2el=float(rng.uniform(60, 160))))
        assert a.check(done, [], now=0.0) is None


def test_mean_term():
    a = EarlyAbort(SLO.parse("ttft:mean<=100ms"), total=None, min_samples=20)
    assert a.check([rec(300.0 + i) for i in range(25)], [], 0.0) is not None
    assert a.check([rec(90.0 + i % 3) for i in range(25)], [], 0.0) is None
    assert "unbounded" in a.check([rec(0, ok=False)], [], 0.0)
