"""Percentile, TPOT, goodput and failed-request math against hand-computed values."""

import json

import numpy as np
import pytest

from autotune.bench.metrics import FAILED_MS, distribution, peak_concurrency, slo_margins, summarize
from autotune.bench.results import Measurement, RequestRecord
from autotune.slo import SLO


def rec(start, ttft, e2el, n_out, itl=None, ok=True, n_in=10):
    return RequestRecord(start_s=start, ttft_ms=ttft if ok else None, e2el_ms=e2el if ok else None,
                         itl_ms=itl if itl is not None else [], input_tokens=n_in,
                         output_tokens=n_out if ok else 0, ok=ok, error=None if ok else "HTTP 500")


def test_distribution_matches_linear_interpolation():
    d = distribution([10.0, 20.0, 30.0, 40.0], "ttft")
    assert d["mean_ttft_ms"] == 25.0
    assert d["median_ttft_ms"] == 25.0
    # numpy linear: index (n-1)*p = 3*0.9 = 2.7 -> 30 + 0.7*10
    assert d["p90_ttft_ms"] == pytest.approx(37.0)
    assert d["p99_ttft_ms"] == pytest.approx(39.7)
    assert d["std_ttft_ms"] == pytest.approx(np.std([10, 20, 30, 40]))
    assert distribution([], "ttft") == {}


def test_summarize_throughput_tpot_and_failures():
    records = [rec(0.1, 100.0, 1000.0, 10, itl=[100.0] * 9),
               rec(0.5, 200.0, 2000.0, 19, itl=[100.0] * 18),
               rec(1.0, 0, 0, 0, ok=False),
               rec(1.0, 50.0, 50.0, 1)]                  # one token: no TPOT, like vLLM
    m = summarize(records, duration_s=4.0)
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_output_tokens"] == 30 and m["total_input_tokens"] == 30
    assert m["output_throughput"] == pytest.approx(30 / 4.0)
    assert m["request_throughput"] == pytest.approx(3 / 4.0)
    assert m["total_token_throughput"] == pytest.approx(60 / 4.0)
    # TPOT = (e2el - ttft) / (n - 1): 900/9 = 100, 1800/18 = 100
    assert m["median_tpot_ms"] == pytest.approx(100.0)
    assert m["median_ttft_ms"] == pytest.approx(100.0)      # of 100, 200, 50
    assert m["max_concurrent_requests"] == 3                 # [0.1,1.1], [0.5,2.5], [1,1.05] overlap at t=1


def test_goodput_counts_requests_meeting_every_term():
    slo = SLO.parse("ttft:p99<=150ms,tpot:p99<=120ms")
    records = [rec(0, 100.0, 1000.0, 10),     # ttft ok, tpot 100 ok -> good
               rec(0, 200.0, 1100.0, 10),     # ttft broken
               rec(0, 100.0, 2000.0, 10),     # tpot 211 broken
               rec(0, 0, 0, 0, ok=False)]     # failed: never good
    m = summarize(records, duration_s=2.0, slo=slo)
    assert m["goodput"] == pytest.approx(1 / 2.0)
    assert m["request_goodput"] == m["goodput"]
    assert m["slo_attainment_pct"] == pytest.approx(25.0)


def test_failed_requests_count_as_infinitely_slow_in_slo_margins():
    slo = SLO.parse("ttft:p50<=150ms")
    ok = [rec(0, 100.0, 500.0, 5) for _ in range(3)]
    assert slo_margins(ok, slo)["slo:ttft:p50"] == pytest.approx(-50.0)
    # 3 good + 3 failed: the median now lies between 100 and the failure sentinel
    margins = slo_margins(ok + [rec(0, 0, 0, 0, ok=False)] * 3, slo)
    assert margins["slo:ttft:p50"] > 1e6
    assert slo_margins([], slo)["slo:ttft:p50"] == float("inf")
    assert FAILED_MS > 1e6


def test_peak_concurrency_is_a_sweep_not_buckets():
    # three back-to-back requests inside one second: vLLM's per-second buckets would say 3
    records = [rec(0.0, 1, 300.0, 2), rec(0.3, 1, 300.0, 2), rec(0.6, 1, 300.0, 2)]
    assert peak_concurrency(records) == 1


def test_a_request_read_in_one_go_has_no_tpot_rather_than_zero():
    # 16 tokens whose chunks all came in the read that brought the first: no time between tokens was seen
    lumped = rec(0.0, 120.0, 120.0, 16, itl=[0.0] * 15)
    assert lumped.tpot_ms is None
    m = summarize([lumped, rec(0.2, 100.0, 250.0, 16, itl=[10.0] * 15)], duration_s=1.0)
    assert m["median_tpot_ms"] == pytest.approx(10.0)         # the one request that measured it
    assert "median_tpot_ms" not in summarize([lumped], duration_s=1.0)   # none measured: no figure, not 0


def test_stored_requests_keep_their_times_to_the_microsecond() -> None:
    """The study DB holds every capacity step's requests: their times are rounded to what the client's
    clock can tell (1 us), the SLO figures computed from the same records are not changed by it, and a
    decode-heavy request's record shrinks to under half its full-digit JSON."""
    itl = [19.904779000000870 + i * 0.1234567891 for i in range(511)]
    rec = RequestRecord(start_s=467.209073567123, ttft_ms=381.52293100000634, e2el_ms=10387.912429999971,
                        itl_ms=itl, input_tokens=128, output_tokens=512, ok=True, scheduled_s=None)
    m = Measurement(metrics={}, records=[rec])
    stored = m.to_json()["requests"][0]
    assert stored["start_s"] == 467.209074 and stored["ttft_ms"] == 381.523 and stored["e2el_ms"] == 10387.912
    assert stored["scheduled_s"] is None and stored["output_tokens"] == 512 and stored["ok"] is True
    assert len(stored["itl_ms"]) == 511
    assert max(abs(a - b) for a, b in zip(stored["itl_ms"], itl)) <= 0.0005
    back = RequestRecord(**stored)
    assert abs(back.tpot_ms - rec.tpot_ms) < 1e-5
    full = json.dumps({**stored, "itl_ms": itl, "start_s": rec.start_s})
    assert len(json.dumps(stored)) < 0.5 * len(full)
