"""The share of prompt tokens a run got from the server's prefix cache, from two /metrics readings."""

from autotune.bench.runner import prefix_hit_pct
from autotune.telemetry.metrics import VllmReading


def reading(queries: float | None, hits: float | None) -> VllmReading:
    return VllmReading(prefix_queries_total=queries, prefix_hits_total=hits)


def test_hit_share_over_the_window() -> None:
    assert prefix_hit_pct(reading(1000, 100), reading(3000, 1400)) == 65.0


def test_no_reading_or_no_lookups_gives_none() -> None:
    assert prefix_hit_pct(None, reading(10, 1)) is None
    assert prefix_hit_pct(reading(10, 1), reading(10, 1)) is None          # nothing looked up
    assert prefix_hit_pct(reading(10, None), reading(20, None)) is None


def test_counters_that_went_down_mean_a_restarted_server() -> None:
    assert prefix_hit_pct(reading(5000, 4000), reading(100, 10)) is None
