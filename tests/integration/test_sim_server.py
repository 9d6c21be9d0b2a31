"""The twin over real HTTP on loopback, launched through the `sim` engine like vLLM."""

import json
import subprocess
import sys

import httpx
import pytest

from autotune import causes
from autotune.engine.base import EngineFailure, LaunchRequest
from autotune.engine.logparse import classify_failure
from autotune.engine.process import find_free_port
from autotune.engine.sim import SimEngine
from autotune.perfmodel import plan
from autotune.perfmodel.roofline import StepModel

FLAGS = ["--max-model-len", "4096", "--max-num-seqs", "64"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = SimEngine("H100", 1, time_scale=5.0, seed=1)
    log = tmp_path_factory.mktemp("sim") / "server.log"
    srv = engine.launch(LaunchRequest(model="glm-4.6v-9b", flags=FLAGS, port=find_free_port(), log_path=log))
    try:
        info = srv.wait_ready()
        yield srv, info
    finally:
        srv.stop()
    assert not srv.alive()


def _stream(url: str, prompt_tokens: int, max_tokens: int, chat: bool = False) -> tuple[list[dict], httpx.Headers]:
    body: dict = {"model": "glm-4.6v-9b", "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                  "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": "w " * prompt_tokens}]
    else:
        body["prompt"] = list(range(prompt_tokens))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    events = []
    with httpx.stream("POST", url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        headers = r.headers
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events, headers


def test_startup_is_parsed_and_labelled(server):
    srv, info = server
    assert info.simulated and info.engine_version.endswith("+sim")
    p = plan("glm-4.6v-9b", FLAGS, "H100", 1)
    assert info.kv_cache_tokens == p.budget.kv_cache_tokens
    assert info.max_concurrency == pytest.approx(p.budget.max_concurrency, abs=0.01)
    models = httpx.get(srv.url + "/v1/models").json()["data"][0]
    assert models["id"] == "glm-4.6v-9b" and models["simulated"] is True


def test_streamed_times_match_the_model(server):
    srv, _ = server
    httpx.post(srv.url + "/reset_prefix_cache")
    events, headers = _stream(srv.url, 512, 20)
    assert headers["x-autotune-simulated"] == "true"
    token_events = [e for e in events if e["choices"]]
    times = [t for e in token_events for t in e["autotune_sim"]["token_times_s"]]
    assert len(times) == 20 and events[-1]["usage"]["completion_tokens"] == 20
    assert events[-1]["usage"]["prompt_tokens"] == 512 and events[-1]["choices"] == []
    assert token_events[-1]["choices"][0]["finish_reason"] == "length"
    p = plan("glm-4.6v-9b", FLAGS, "H100", 1)
    m = StepModel(p.profile, p.config, p.gpu)
    # alone on the engine: TTFT = one prefill step, then one decode step per token
    assert times[0] == pytest.approx(m.step(1, 512, 512, 512 * 256, True).seconds, rel=1e-3)
    gaps = [b - a for a, b in zip(times, times[1:])]
    for i, gap in enumerate(gaps):
        assert gap == pytest.approx(m.decode_step(1, 512 + i + 1).seconds, rel=1e-3)


def test_chat_stream_and_metrics(server):
    srv, _ = server
    events, _ = _stream(srv.url, 40, 5, chat=True)
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = httpx.get(srv.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "autotune_sim_coalesced_chunks_total"):
        assert f'{name}' in text
    assert 'vllm:num_requests_running{engine="0",model_name="glm-4.6v-9b"} 0.0' in text
    tel = httpx.get(srv.url + "/sim/telemetry").json()
    g = tel["gpus"][0]
    assert tel["simulated"] is True and g["mem_total_mib"] == pytest.approx(79.11 * 1024, rel=1e-3)
    assert 0 < g["mem_used_mib"] <= g["mem_total_mib"] and g["energy_mj"] > 0 and g["power_w"] >= 75


def test_too_long_request_is_a_400(server):
    srv, _ = server
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": list(range(4000)), "max_tokens": 200})
    assert r.status_code == 400 and "maximum context length is 4096" in r.json()["error"]["message"]


def test_kv_too_small_fails_like_vllm(tmp_path):
    engine = SimEngine("H100", 1, time_scale=100.0)
    srv = engine.launch(LaunchRequest(model="llama-3.1-8b", port=find_free_port(), log_path=tmp_path / "x.log",
                                      flags=["--gpu-memory-utilization", "0.25", "--max-model-len", "131072"]))
    with pytest.raises(EngineFailure) as e:
        srv.wait_ready()
    assert e.value.cause == causes.KV_TOO_SMALL and e.value.exit_code == 1


def test_unknown_flag_exits_2_like_argparse(tmp_path):
    done = subprocess.run([sys.executable, "-m", "autotune", "sim-serve", "--gpu", "H100", "--model-profile",
                           "glm-4.6v-9b", "--", "--max-num-seqz", "64"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert classify_failure(done.stderr, 2)[0] == causes.BAD_FLAG
    assert SimEngine("H100", 1).unknown_flags(["--max-num-seqs", "8", "--max-num-seqz", "--no-enable-prefix-caching"]) \
        == ["--max-num-seqz"]


def test_estimate_json(tmp_path):
    done = subprocess.run([sys.executable, "-m", "autotune", "estimate", "--gpu", "A800", "--num-gpus", "8",
                           "--model-profile", "glm-5.3-flash", "--json", "--no-curve", "--", "--tensor-parallel-size",
                           "8", "--max-model-len", "1048576", "--gpu-memory-utilization", "0.95", "--max-num-seqs", "32"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["fits"] and abs(out["kv_cache_tokens"] - 2_004_983) / 2_004_983 < 0.10
    assert out["weights_gib_per_gpu"] == pytest.approx(39.8, abs=0.2) and out["max_concurrency"] > 1.8
