"""Early stopping inside a real capacity search (real HTTP on loopback, the mock server whose batch
model is known): the search ends once the front dominates the bound, and the bound really bounds
what the full search then measures."""

from __future__ import annotations

from autotune.bench import find_capacity, parse_workload
from autotune.bench.capacity import capacity_objectives
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.slo import SLO
from autotune.tuner.earlystop import EarlyStop

W = parse_workload("random:input_len=20,output_len=16")
SLO_20 = SLO.parse("tpot:p50<=14.125ms")     # TPOT = 4 + 0.5 x batch ms: capacity 20 streams
OBJ, DIRS = ["capacity_tps", "p50_tpot_ms"], ["maximize", "minimize"]


async def test_the_bound_holds_and_a_dominated_search_stops_early() -> None:
    async with serve(build_app(MockConfig(mode="batch", step_ms=4, per_seq_ms=0.5))) as url:
        full = await find_capacity(url, "mock", W, SLO_20, requests_per_step=80, warmup=8)
        # An incumbent far better on both objectives: the search stops as soon as it is bracketed.
        stop = EarlyStop(OBJ, DIRS, [[1e9, 0.1]])
        cut = await find_capacity(url, "mock", W, SLO_20, requests_per_step=80, warmup=8,
                                  should_stop=stop.should_stop)
    assert stop.stopped and stop.bound is not None
    assert any(not s.slo_met for s in cut.steps)
    never = EarlyStop(OBJ, DIRS, [[1.0, 1e9]])      # an incumbent worse on both never stops the full search
    assert not any(never.should_stop(full.steps[:i]) for i in range(1, len(full.steps) + 1))
    measured = capacity_objectives(full)
    assert full.capacity is not None
    # The bound the full search's own first steps give (where it would have stopped) bounds what that search
    # then measured. Compared across the two searches instead, a busy box read each server late by its own
    # amount (a bound of 13.4 ms against 12.6 measured, the client not flagged)
    again = EarlyStop(OBJ, DIRS, [[1e9, 0.1]])
    at = next(i for i in range(1, len(full.steps) + 1) if again.should_stop(full.steps[:i]))
    assert again.bound is not None and at <= len(full.steps)
    assert again.bound["capacity_tps"] >= measured["capacity_tps"]      # an upper bound on what was measured
    assert again.bound["p50_tpot_ms"] <= measured["p50_tpot_ms"]        # a lower bound on the latency
    if "client_saturated" not in cut.flags + full.flags:
        assert len(cut.steps) < len(full.steps)                          # paths differ on a busy box
