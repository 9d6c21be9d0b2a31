"""The twin's picks: the best first, then spread over the candidates it cannot tell from the best."""

from __future__ import annotations

from typing import Any, Mapping

from autotune.space import SearchSpace
from autotune.tuner.warmstart import TIE, warm_start_picks

SPACE = SearchSpace.from_mapping({"params": {
    "max_num_seqs": {"type": "int", "low": 16, "high": 1024, "log": True, "default": 1024},
    "max_num_batched_tokens": {"type": "int", "low": 1024, "high": 32768, "log": True, "default": 8192},
    "enable_chunked_prefill": {"type": "bool", "default": True}}}, "test")


def _capped(params: Mapping[str, Any]) -> dict[str, float]:
    """A twin like the real one near a TTFT limit: more batched tokens help up to 8192, and max-num-seqs
    above the 64 streams the SLO allows changes nothing, nor does chunked prefill."""
    return {"capacity_tps": 1000.0 * min(params["max_num_batched_tokens"], 8192) / 8192
            * min(params["max_num_seqs"], 64) / 64}


def test_picks_tied_with_the_best_are_spread_not_near_copies() -> None:
    picks, ranking = warm_start_picks(SPACE, [], 1, _capped, objective="capacity_tps", maximize=True,
                                      n=200, k=3, seed=3)
    top = ranking.values[0]
    tied = [v for v in ranking.values if v >= top * (1 - TIE)]
    assert len(tied) >= 10                      # the twin cannot tell many candidates apart
    assert picks[0].rank == 1 and picks[0].predicted["capacity_tps"] == top
    assert all(p.predicted["capacity_tps"] >= top * (1 - TIE) for p in picks)
    # the second pick differs from the first in the choice and in both ranges by a wide margin
    a, b = picks[0].params, picks[1].params
    assert a["enable_chunked_prefill"] != b["enable_chunked_prefill"]
    assert max(a["max_num_seqs"], b["max_num_seqs"]) / min(a["max_num_seqs"], b["max_num_seqs"]) > 2
    # ranks are the twin's own: the spread picks are not simply the 2nd and 3rd best it ranked
    assert [p.rank for p in picks] != [1, 2, 3]


def test_without_a_tie_the_picks_are_the_best_in_order() -> None:
    def strict(params: Mapping[str, Any]) -> dict[str, float]:     # every knob moves the prediction a lot
        return {"capacity_tps": params["max_num_seqs"] * 10.0 + params["max_num_batched_tokens"] / 100
                + (500.0 if params["enable_chunked_prefill"] else 0.0)}

    picks, ranking = warm_start_picks(SPACE, [], 1, strict, objective="capacity_tps", maximize=True,
                                      n=100, k=3, seed=1)
    assert [p.rank for p in picks] == [1, 2, 3]
    assert [p.predicted["capacity_tps"] for p in picks] == ranking.values[:3]


def test_a_minimized_objective_ties_below_the_best() -> None:
    def latency(params: Mapping[str, Any]) -> dict[str, float]:     # only chunked prefill matters
        return {"p50_tpot_ms": 5.0 if params["enable_chunked_prefill"] else 9.0}

    picks, _ = warm_start_picks(SPACE, [], 1, latency, objective="p50_tpot_ms", maximize=False, n=60, k=3, seed=2)
    assert all(p.params["enable_chunked_prefill"] for p in picks)
    assert len({(p.params["max_num_seqs"], p.params["max_num_batched_tokens"]) for p in picks}) == 3
