"""Samplers against a real HTTP server on loopback: the simulator's `/sim/telemetry` and a
vLLM-style `/metrics`, both advancing while the sampler runs."""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from autotune.telemetry import TelemetryTarget, format_summary, get_source, objectives

TIME_SCALE = 10.0         # the simulated clock runs 10x faster than the wall clock
SIM_POWER_W = (400.0, 250.0, 600.0)


class FakeServer(BaseHTTPRequestHandler):
    t0 = time.monotonic()
    served: dict[str, list] = {}     # what it answered, in order: the simulator clock; vLLM's counters

    def _record(self, key: str, value: object) -> None:
        self.served.setdefault(key, []).append(value)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        elapsed = time.monotonic() - self.t0
        if self.path == "/slow/metrics":      # a server busy streaming answers /metrics late
            time.sleep(1.0)
            self.path = "/metrics"
        if self.path == "/metrics":
            body = (f'vllm:num_requests_running{{model_name="m"}} {min(64, int(elapsed * 100))}\n'
                    f'vllm:num_requests_waiting{{model_name="m"}} {int(elapsed * 10) % 5}\n'
                    f'vllm:kv_cache_usage_perc{{model_name="m"}} {min(0.9, elapsed)}\n'
                    f'vllm:num_preemptions_total{{model_name="m"}} {100 + int(elapsed * 20)}\n'
                    f'vllm:prefix_cache_queries_total{{model_name="m"}} {1000 + int(elapsed * 1000)}\n'
                    f'vllm:prefix_cache_hits_total{{model_name="m"}} {500 + int(elapsed * 250)}\n').encode()
            self._record("counters", (100 + int(elapsed * 20), 1000 + int(elapsed * 1000), 500 + int(elapsed * 250)))
            ctype = "text/plain; version=0.0.4"
        elif self.path == "/sim/telemetry":
            sim_t = elapsed * TIME_SCALE
            self._record("sim_time", sim_t)
            body = json.dumps({"simulated": True, "time_s": sim_t, "gpus": [
                {"index": i, "power_w": p, "energy_mj": 1e6 + p * sim_t * 1000, "util_pct": 90.0,
                 "mem_util_pct": 40.0, "mem_used_mib": 70_000.0 + 1000 * i, "mem_total_mib": 81_559.0,
                 "sm_clock_mhz": 1980.0, "temp_c": 60.0} for i, p in enumerate(SIM_POWER_W)]}).encode()
            ctype = "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server_url() -> Iterator[str]:
    FakeServer.t0 = time.monotonic()
    FakeServer.served = {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_sim_source_over_http(server_url: str, wait_until) -> None:
    sampler = get_source("sim").sampler(TelemetryTarget(server_pid=None, gpus=[0, 2], server_url=server_url), hz=20)
    sampler.start()
    # 15 samples, and a scrape that saw the gauges at their top (64 running from 0.64 s, KV 80 % from 0.8 s)
    wait_until(lambda: sampler.series.seen >= 15 and sampler.scraper.window.peak.get("kv_usage_pct", 0) >= 80,
               what="15 samples and a scrape with the KV cache at 80 %")
    s = sampler.stop()
    assert s.source == "sim" and s.simulated and s.gpus == [0, 2] and s.samples >= 15
    assert s.mean_power_w == pytest.approx(1000.0)                      # GPUs 0 and 2 only
    # energy is counted on the simulator's clock, so its rate is the simulated power, not 10x it
    assert s.energy_method == "counter" and s.energy_j / s.energy_window_s == pytest.approx(1000.0, rel=0.01)
    # and its window is the simulator's time from the first answer read to the last (10x the wall clock)
    sim_time = FakeServer.served["sim_time"]
    if sampler.probe.failures == 0:                                     # every answer was read
        assert s.energy_window_s == pytest.approx(sim_time[-1] - sim_time[0], abs=0.002)
    else:                                                               # one given up on (a loaded machine)
        assert 0 < s.energy_window_s <= sim_time[-1] - sim_time[0] + 0.002
    assert (s.peak_mem_used_mib, s.mem_total_mib) == (72_000.0, 81_559.0)
    # vLLM's metrics from the same server, at the scrape's own rate
    assert s.max_running == 64 and 80 <= s.peak_kv_usage_pct <= 90
    # counters count this window only: the last scrape's less the first's (the totals are over 100)
    (pre0, q0, hit0), (pre1, q1, hit1) = FakeServer.served["counters"][0], FakeServer.served["counters"][-1]
    assert sampler.scraper.window.errors == 0 and s.preemptions == pre1 - pre0 > 0
    assert s.prefix_cache_hit_rate == pytest.approx((hit1 - hit0) / (q1 - q0)) == pytest.approx(0.25, abs=0.03)
    assert any("kv_usage_pct" in r for r in s.series) and any("power_w" in r for r in s.series)
    obj = objectives(s, output_tokens=12_000, duration_s=1.2, num_gpus=2, output_tps=10_000.0)
    assert obj["tokens_per_joule"] == pytest.approx(10.0, rel=0.01)
    assert format_summary(s).endswith("simulated") and "preemptions" in format_summary(s)


def test_cpu_source_with_metrics_scrape(server_url: str) -> None:
    sampler = get_source("cpu").sampler(TelemetryTarget(server_pid=os.getpid(), server_url=server_url), hz=20)
    sampler.start()
    # keep this process busy until the sampler has a few samples: on a loaded 2-core machine its thread
    # may get little time, and a CPU percentage needs two readings
    started = time.monotonic()
    while not (time.monotonic() - started > 0.8 and sampler.series.seen >= 4):
        assert time.monotonic() - started < 60, "the sampler took fewer than 4 samples in 60 s"
        sum(range(10_000))
    s = sampler.stop()
    assert s.source == "cpu" and s.cpu_pct_mean > 10 and s.rss_peak_mib > 10
    assert s.peak_kv_usage_pct is not None and s.max_running is not None


def test_sim_server_gone_is_marked_not_fatal(wait_until) -> None:
    sampler = get_source("sim").sampler(TelemetryTarget(gpus=[0], server_url="http://127.0.0.1:9"), hz=20)
    sampler.start()
    wait_until(lambda: sampler.probe.failures >= 2, what="two failed reads")
    s = sampler.stop()
    assert s.samples == 0 and s.mean_power_w is None and "not read" in (s.note or "")
    assert s.preemptions is None


def test_scrapes_answered_late_under_load_still_count(server_url: str, wait_until) -> None:
    from autotune.telemetry.metrics import MetricsScraper

    scraper = MetricsScraper(server_url + "/slow", hz=4)
    scraper.start()
    wait_until(lambda: scraper.series.seen >= 2, what="two scrapes answered (1 s late each)")
    scraper.stop()
    assert scraper.window.errors == 0
    assert scraper.series.seen >= 2 and scraper.window.peak.get("running", 0) > 0
