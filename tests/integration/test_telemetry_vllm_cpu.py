"""The `cpu` source and the /metrics scrape on a real vLLM CPU-build server under load: the
server's whole process tree (API server + engine core) and vLLM's own scheduler gauges."""

from __future__ import annotations

import asyncio
import json

import pytest

from autotune.bench import parse_workload, run_load
from autotune.telemetry import (TelemetryTarget, format_summary, get_source, objectives, series_for_store,
                                summary_for_store)

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_cpu_source_records_the_server_under_load(vllm_server) -> None:
    # the load the trial runner itself sends: streamed completions from autotune's own client
    workload = parse_workload({"kind": "random", "input_len": 64, "output_len": 64})
    sampler = get_source("cpu").sampler(TelemetryTarget(server_pid=vllm_server.server.pid,
                                                        server_url=vllm_server.url), hz=10)
    sampler.start()
    m = asyncio.run(run_load(vllm_server.url, vllm_server.model, workload, concurrency=8, num_requests=48))
    s = sampler.stop()
    tokens = int(m.metrics["total_output_tokens"])

    assert tokens == 48 * 64
    assert s.source == "cpu" and s.samples >= 5
    assert max(r.get("procs", 0) for r in s.series) >= 2            # API server and engine core
    assert s.cpu_pct_mean > 30                                       # the engine busy decoding
    assert s.rss_peak_mib > 300 and s.mem_headroom is not None and 0 < s.mem_headroom < 1
    # vLLM's own gauges, scraped and parsed. Their values are not asserted: under load the CPU build's
    # API server answers /metrics late and its gauges move in coarse updates, so in a short window on
    # 2 cores the scrapes that land may all read 0 (seen in full-suite runs; standalone runs saw > 0).
    assert s.max_running is not None and s.max_waiting is not None and s.peak_kv_usage_pct is not None
    assert any("running" in r for r in s.series)
    assert s.preemptions is not None and s.preemptions >= 0
    obj = objectives(s, tokens, s.duration_s, 1, tokens / s.duration_s)
    assert set(obj) == {"tps_per_gpu", "mem_headroom"}
    stored = json.loads(json.dumps(summary_for_store(s)))            # what the trial row keeps
    assert stored["cpu_pct_mean"] == s.cpu_pct_mean and stored["rss_peak_mib"] == s.rss_peak_mib
    assert len(series_for_store(s)) <= 2000
    print(format_summary(s))
