import pytest

from autotune.errors import UserError
from autotune.slo import SLO, SLOError, stat_key


def test_shorthand_means_p99():
    slo = SLO.parse("ttft=1s")
    (term,) = slo.terms
    assert (term.metric, term.stat, term.limit_ms) == ("ttft", "p99", 1000.0)
    assert term.key == "slo:ttft:p99" and term.metric_key == "p99_ttft_ms"


def test_full_grammar_and_units():
    slo = SLO.parse("ttft:p95<=800ms, tpot:p99<=50ms,e2el:p99<=10s,itl:mean<=20ms,ttft:p99.9<=2s")
    assert [(t.metric, t.stat, t.limit_ms) for t in slo.terms] == [
        ("ttft", "p95", 800.0), ("tpot", "p99", 50.0), ("e2el", "p99", 10000.0), ("itl", "mean", 20.0),
        ("ttft", "p99.9", 2000.0)]
    assert stat_key("ttft", "p50") == "median_ttft_ms" and stat_key("itl", "mean") == "mean_itl_ms"
    assert stat_key("ttft", "p99.9") == "p99.9_ttft_ms"


@pytest.mark.parametrize("text,needle", [
    ("latency=1s", "'latency'"), ("ttft:p42<=1s", "'p42'"), ("ttft=1", "unit"), ("ttft=abc", "malformed"),
    ("", "empty"), ("ttft=1s,ttft:p99<=2s", "repeats"), ("ttft:p99=1s", "<="), ("ttft=0ms", "positive")])
def test_errors_name_the_bad_term(text, needle):
    with pytest.raises(SLOError) as e:
        SLO.parse(text)
    assert needle in str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in str(e.value)


def test_margins_are_measured_minus_limit():
    slo = SLO.parse("ttft:p99<=1s,tpot:p50<=20ms")
    margins = slo.margins({"p99_ttft_ms": 1200.0, "median_tpot_ms": 15.0})
    assert margins == {"slo:ttft:p99": 200.0, "slo:tpot:p50": -5.0}
    assert not slo.met({"p99_ttft_ms": 1200.0, "median_tpot_ms": 15.0})
    assert slo.met({"p99_ttft_ms": 999.0, "median_tpot_ms": 20.0})
    assert slo.margins({})["slo:ttft:p99"] == float("inf")


def test_request_ok_is_per_request_goodput():
    slo = SLO.parse("ttft=500ms,tpot:p99<=30ms,itl:p50<=40ms")
    assert slo.request_ok(400, 25, 2000, [30, 35, 50])
    assert not slo.request_ok(600, 25, 2000, [30])          # ttft too slow
    assert not slo.request_ok(400, 31, 2000, [30])          # tpot too slow
    assert not slo.request_ok(400, 25, 2000, [45, 50, 60])  # this request's median ITL is 50
    assert not slo.request_ok(None, None, None)             # failed request never counts
    assert slo.request_ok(100, None, 100, [])               # one token: no TPOT to break
