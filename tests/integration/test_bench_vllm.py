"""`run_load` and `find_capacity` against the real vLLM CPU build (the shared session server)."""

import pytest

from autotune.bench import find_capacity, parse_workload, run_load
from autotune.slo import SLO

pytestmark = pytest.mark.vllm


async def test_run_load_on_vllm_counts_tokens_with_the_model_tokenizer(vllm_server):
    w = parse_workload("random:input_len=64,output_len=16")
    m = await run_load(vllm_server.url, vllm_server.model, w, concurrency=4, num_requests=16, warmup=2,
                       slo=SLO.parse("ttft=30s"))
    x = m.metrics
    assert x["completed"] == 16 and x["failed"] == 0
    assert x["total_output_tokens"] == 16 * 16                 # ignore_eos + the server's usage count
    # the demo model's tokenizer is local: prompts are exactly 64 tokens, and the server counts the same
    assert all(r.input_tokens == 64 for r in m.records)
    # vLLM merges a request's pending outputs into one chunk when its reader is late (the API server's output
    # collector), so on a busy box whole 16-token answers can arrive at once (seen: TTFT = E2EL): such a
    # request has no TPOT, never a TPOT of 0
    assert 0 < x["median_ttft_ms"] <= x["median_e2el_ms"]
    assert x.get("median_tpot_ms") is None or x["median_tpot_ms"] > 0
    assert all(r.tpot_ms is None or r.tpot_ms > 0 for r in m.records)
    assert x["slo_attainment_pct"] == 100.0


async def test_capacity_search_on_vllm_reports_steps_and_cache_state(vllm_server):
    r = await find_capacity(vllm_server.url, vllm_server.model, parse_workload("random:input_len=32,output_len=8"),
                            SLO.parse("ttft:p50<=10s"), search="concurrency", max_steps=2, requests_per_step=16,
                            warmup=2, upper=4)
    assert 1 <= len(r.steps) <= 2 and r.capacity is not None
    assert isinstance(r.cache_reset, bool)       # the shared server runs without VLLM_SERVER_DEV_MODE: 404
    assert r.at_capacity.metrics["completed"] > 0


async def test_a_replayed_run_reports_the_prefix_cache_hits_that_flatter_it(vllm_server):
    # the same seed twice on one server: the second run's prompts are served from the prefix cache,
    # and the measurement says so instead of passing the faster TTFT off as the configuration's
    w = parse_workload("random:input_len=300,output_len=4")     # the CPU build caches whole 128-token blocks
    first = await run_load(vllm_server.url, vllm_server.model, w, concurrency=2, num_requests=8, seed=4242)
    again = await run_load(vllm_server.url, vllm_server.model, w, concurrency=2, num_requests=8, seed=4242)
    assert first.metrics["prefix_cache_hit_pct"] < 20
    assert again.metrics["prefix_cache_hit_pct"] > 60
