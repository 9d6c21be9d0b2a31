"""vLLM /metrics: the Prometheus parser and the scraper's window arithmetic (httpx MockTransport)."""

from __future__ import annotations

import httpx
import pytest

from autotune.telemetry import TelemetrySummary, VllmReading, parse_prometheus
from autotune.telemetry.metrics import MetricsScraper

EXPOSITION = '''# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 12.0
vllm:num_requests_running{engine="1",model_name="demo"} 4.0
vllm:num_requests_waiting{engine="0",model_name="demo"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="demo"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="demo"} 0.625
vllm:num_preemptions_total{engine="0",model_name="demo"} 7.0
vllm:num_preemptions_created{engine="0",model_name="demo"} 1.7e+09
vllm:prefix_cache_queries_total{engine="0",model_name="demo"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="demo"} 250.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="de\\"mo, x"} 5 1700000000000
odd line without value
vllm:num_requests_waiting{engine="1",model_name="demo"} NaN
'''


def test_parser_reads_labels_escapes_timestamps_and_skips_junk() -> None:
    samples = parse_prometheus(EXPOSITION)
    names = [n for n, _, _ in samples]
    assert "odd" not in " ".join(names)
    bucket = [s for s in samples if s[0].endswith("_bucket")][0]
    assert bucket[1] == {"le": "+Inf", "model_name": 'de"mo, x'} and bucket[2] == 5.0


def test_reading_sums_counts_and_takes_the_fullest_cache() -> None:
    r = VllmReading.from_text(EXPOSITION)
    assert r.running == 16.0                 # summed over engines
    assert r.waiting == 3.0                  # NaN ignored
    assert r.kv_usage_pct == 62.5            # the fullest engine, as a percentage
    assert r.preemptions_total == 7.0        # `_created` is not the counter
    assert (r.prefix_queries_total, r.prefix_hits_total) == (1000.0, 250.0)


def test_older_names_are_understood() -> None:
    r = VllmReading.from_text('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
                              'vllm:gpu_prefix_cache_queries_total{model_name="m"} 10\n')
    assert r.kv_usage_pct == 50.0 and r.prefix_queries_total == 10.0 and r.running is None


def scripted(pages: list[str]) -> httpx.MockTransport:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        i = min(calls["n"], len(pages) - 1)
        calls["n"] += 1
        if pages[i] == "down":
            return httpx.Response(503)
        return httpx.Response(200, text=pages[i])
    return httpx.MockTransport(handler)


def page(running: float, waiting: float, kv: float, pre: float, q: float, h: float) -> str:
    return (f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
            f"vllm:kv_cache_usage_perc {kv}\nvllm:num_preemptions_total {pre}\n"
            f"vllm:prefix_cache_queries_total {q}\nvllm:prefix_cache_hits_total {h}\n")


def test_window_peaks_and_counter_deltas() -> None:
    pages = ["down", page(2, 0, 0.1, 40, 1000, 100), page(64, 9, 0.91, 45, 1500, 300), page(8, 0, 0.3, 52, 2000, 400)]
    sc = MetricsScraper("http://127.0.0.1:9", transport=scripted(pages))
    for _ in pages:
        sc.scrape_once()
    s = TelemetrySummary(source="test")
    sc.fill(s)
    assert sc.window.errors == 1
    assert (s.max_running, s.max_waiting, s.peak_kv_usage_pct) == (64.0, 9.0, 91.0)
    assert s.preemptions == 12.0                              # 52 - 40: only this window's
    assert s.prefix_cache_hit_rate == pytest.approx(300 / 1000)
    assert [r["kv_usage_pct"] for r in sc.series.rows] == [10.0, 91.0, 30.0]


def test_counter_reset_and_no_queries() -> None:
    sc = MetricsScraper("http://127.0.0.1:9", transport=scripted([page(1, 0, 0, 30, 5, 1), page(1, 0, 0, 4, 5, 1)]))
    sc.scrape_once()
    sc.scrape_once()
    s = TelemetrySummary(source="test")
    sc.fill(s)
    assert s.preemptions == 4.0                # went down: the server restarted, count from zero
    assert s.prefix_cache_hit_rate is None     # no new queries in the window: no rate, not 0


def test_unreachable_server_leaves_fields_empty() -> None:
    sc = MetricsScraper("http://127.0.0.1:9", transport=scripted(["down"]))
    sc.start()
    sc.stop()
    s = TelemetrySummary(source="test")
    sc.fill(s)
    assert s.peak_kv_usage_pct is None and s.preemptions is None and sc.window.errors >= 2
