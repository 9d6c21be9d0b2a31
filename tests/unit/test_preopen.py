"""How many sockets a load step opens before its clock starts (bench/runner.py): enough that no measured
request of a closed loop, and none of a burst, waits for a TCP handshake; never more than the cap."""

from __future__ import annotations

import math

import pytest

from autotune.bench.runner import PREOPEN_MAX, _preopen


@pytest.mark.parametrize("concurrency, rate, num_requests, want", [
    (53, None, 200, 53),                  # closed loop: its concurrency
    (8, 100.0, 200, 8),                   # open loop with a cap: the cap
    (None, 12.5, 200, 13),                # open loop: its first second's requests
    (None, math.inf, 40, 40),             # everything at once: every request
    (None, None, 24, 24),                 # a trace replay: each request may be in flight at once
    (None, None, None, PREOPEN_MAX),      # a replay bounded by time
    (10_000, None, None, PREOPEN_MAX),    # the cap
    (None, 0.5, 100, 1),
])
def test_preopen_counts(concurrency, rate, num_requests, want) -> None:
    assert _preopen(concurrency, rate, num_requests) == want
