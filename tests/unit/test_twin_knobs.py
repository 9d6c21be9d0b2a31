"""What the twin models of the new knobs, checked against the measurements that exist, and the warm
start's treatment of the knobs it does not model (drawn for each pick, never ranked as neutral)."""

from __future__ import annotations

import json

import pytest

from autotune import causes
from autotune.perfmodel import known_flags, plan
from autotune.perfmodel.knobs import MODELLED, UNMODELLED, env_key, modelled
from autotune.perfmodel.roofline import StepModel
from autotune.sim.scheduler import Scheduler, SimRequest
from autotune.space import SearchSpace
from autotune.tuner.warmstart import modelled_subspace, warm_start_picks

GLM53 = ["--tensor-parallel-size", "8", "--max-model-len", "1048576", "--gpu-memory-utilization", "0.95"]
BASE = ["--max-model-len", "4096"]


def test_every_knob_of_the_shipped_spaces_is_modelled_or_marked_unmodelled():
    assert not set(MODELLED) & set(UNMODELLED)
    for name in ("default", "cpu", "multimodal"):
        space = SearchSpace.load(name).narrowed(8, True, {"speculative": {"draft_model": "d"}})
        for p in space.params.values():
            for knob in p.knobs():
                assert knob in MODELLED or knob in UNMODELLED or knob.startswith("env:"), (name, knob)
    assert not modelled([env_key("VLLM_CPU_KVCACHE_SPACE")])


def test_the_sim_accepts_every_flag_the_default_space_sends():
    for name in ("default", "multimodal"):
        space = SearchSpace.load(name).narrowed(8, True, {"speculative": {"draft_model": "d"}})
        assert [f for f in space.flag_names() if f not in known_flags()] == []


def test_a_capture_size_stands_for_max_num_seqs_in_graph_memory_as_seed_001_measured():
    """Seed 001: max-num-seqs 256 -> 32 shrank the graphs from 3.46 to 2.71 GiB (the capture set is
    [1, 2, 4, 8..64]). A capture size of 64 at max-num-seqs 256 captures that same set."""
    by_seqs = plan("glm-5.3-flash", GLM53 + ["--max-num-seqs", "32"], "A800", 8).budget
    by_cap = plan("glm-5.3-flash", GLM53 + ["--max-num-seqs", "256", "--max-cudagraph-capture-size", "64"],
                  "A800", 8).budget
    full = plan("glm-5.3-flash", GLM53 + ["--max-num-seqs", "256"], "A800", 8).budget
    assert by_cap.capture_sizes == by_seqs.capture_sizes == 11 and full.capture_sizes == 51
    assert by_cap.graphs_gib == pytest.approx(by_seqs.graphs_gib) == pytest.approx(2.71, abs=0.05)
    assert full.graphs_gib == pytest.approx(3.46, abs=0.05)


def test_decode_batches_above_the_capture_size_pay_the_eager_launches():
    p = plan("llama-3.1-8b", BASE + ["--max-num-seqs", "256", "--max-cudagraph-capture-size", "64"], "H100", 1)
    full = plan("llama-3.1-8b", BASE + ["--max-num-seqs", "256"], "H100", 1)
    small, big = StepModel(p.profile, p.config, p.gpu), StepModel(full.profile, full.config, full.gpu)
    assert small.decode_step(32, 1024).seconds == pytest.approx(big.decode_step(32, 1024).seconds)
    assert small.decode_step(128, 1024).seconds > big.decode_step(128, 1024).seconds


def test_optimization_levels_map_to_graphs_as_vllm_defines_them():
    steps = {}
    for level in (0, 1, 2, 3):
        p = plan("llama-3.1-8b", BASE + ["--optimization-level", str(level)], "H100", 1)
        steps[level] = StepModel(p.profile, p.config, p.gpu).decode_step(8, 1024).seconds
        assert (p.budget.graphs_gib == 0) is (level == 0)
    assert steps[0] > steps[1] > steps[2] == steps[3]      # O3 is O2 in vLLM today


def test_kv_bytes_replace_the_fraction_and_too_many_do_not_start():
    gib = 2**30
    p = plan("llama-3.1-8b", BASE + ["--kv-cache-memory-bytes", str(20 * gib), "--gpu-memory-utilization", "0.5"],
             "H100", 1).budget
    assert p.fits and p.kv_gib == pytest.approx(20.0)
    assert p.kv_cache_tokens == pytest.approx(20 * gib / p.kv_bytes_per_token, rel=0.01)
    huge = plan("llama-3.1-8b", BASE + ["--kv-cache-memory-bytes", "75G"], "H100", 1).budget
    assert not huge.fits and huge.cause == causes.STARTUP_OOM and "--kv-cache-memory-bytes" in huge.reason


def test_throughput_mode_doubles_the_defaults_vllm_fills_in():
    base = plan("llama-3.1-8b", BASE, "H100", 1).config
    thr = plan("llama-3.1-8b", BASE + ["--performance-mode", "throughput"], "H100", 1).config
    assert (thr.max_num_seqs, thr.max_num_batched_tokens) == (2 * base.max_num_seqs, 2 * base.max_num_batched_tokens)
    set_by_user = plan("llama-3.1-8b", BASE + ["--performance-mode", "throughput", "--max-num-seqs", "64"], "H100", 1)
    assert set_by_user.config.max_num_seqs == 64


def test_the_long_prefill_threshold_caps_a_prompt_while_others_wait():
    def first_step(threshold: int) -> dict[str, int]:
        p = plan("llama-3.1-8b", BASE + ["--max-num-batched-tokens", "8192", "--long-prefill-token-threshold",
                                         str(threshold)], "H100", 1)
        s = Scheduler(p)
        s.add(SimRequest("long", 3000, 8, 0.0))
        s.add(SimRequest("short", 100, 8, 0.0))
        return {r.rid: n for r, n in s.schedule().items}

    assert first_step(0) == {"long": 3000, "short": 100}
    assert first_step(512) == {"long": 512, "short": 100}       # the short prompt is not queued behind it
    p = plan("llama-3.1-8b", BASE + ["--long-prefill-token-threshold", "512"], "H100", 1)
    alone = Scheduler(p)
    alone.add(SimRequest("long", 3000, 8, 0.0))
    assert [n for _, n in alone.schedule().items] == [3000]      # alone, nobody to starve


def test_the_warm_start_ranks_modelled_knobs_only_and_names_the_others_for_each_pick():
    space = SearchSpace.from_mapping({"params": {
        "max_num_seqs": {"type": "int", "low": 16, "high": 512, "log": True, "default": 256},
        "stream_interval": {"type": "categorical", "choices": [1, 4, 16], "default": 1},
        "attention_backend": {"type": "categorical", "choices": ["none", "FLASH_ATTN"], "default": "none"},
        "my_env": {"type": "bool", "env": "VLLM_SOMETHING", "default": False},
        "long_prefill_token_threshold": {"type": "categorical", "choices": [0, 512], "default": 0,
                                         "when": {"stream_interval": [1]}}}}, "t")
    sub, left = modelled_subspace(space)
    assert list(sub.params) == ["max_num_seqs", "long_prefill_token_threshold"]
    assert not sub.params["long_prefill_token_threshold"].when   # active at stream_interval's default
    assert left == ["stream_interval", "attention_backend", "my_env"]
    seen: list[dict] = []

    def twin(params):            # the twin never sees a knob it does not model
        seen.append(dict(params))
        return {"capacity_tps": float(params["max_num_seqs"])}

    picks, _ = warm_start_picks(space, [], 1, twin, objective="capacity_tps", maximize=True, n=20, k=3, seed=1)
    assert seen and all(set(p) <= {"max_num_seqs", "long_prefill_token_threshold"} for p in seen)
    assert picks and all(p.sampled == left and not set(p.params) & set(left) for p in picks)


def test_a_pick_gets_its_unmodelled_knobs_drawn_inside_the_rules():
    """With chunked MM input off, a step's token budget must hold the largest image: a rule between a knob
    the twin ranks (the budget) and one it does not (the chunked MM switch). A pick with a small budget gets
    the switch drawn on the side the rule allows, every time; a parent of a ranked knob keeps it active; the same pick gets the same draw."""
    from autotune.perfmodel.profiles import load_profile
    from autotune.space.multimodal import MultimodalContext, with_multimodal
    from autotune.tuner.warmstart import Pick, complete_pick

    vision = load_profile("qwen2.5-vl-7b").vision
    space = with_multimodal(SearchSpace.load("cpu"), vision)
    space.multimodal = MultimodalContext(vision, max_images=2)
    sub, left = modelled_subspace(space)
    assert "disable_chunked_mm_input" in left and "max_num_batched_tokens" in sub.params
    pick = Pick({"max_num_batched_tokens": 2048, "max_num_seqs": 16, "limit_mm_per_prompt": "img2"}, 1, {}, left)
    drawn = [complete_pick(space, pick, [], 1, seed="s:0", slot=i) for i in range(30)]
    assert all(d is not None and d["disable_chunked_mm_input"] is False and d["max_num_batched_tokens"] == 2048
               and not space.violations(d, [], 1) for d in drawn)
    assert all(set(d) == set(pick.params) | set(left) for d in drawn)          # every unmodelled knob drawn
    assert complete_pick(space, pick, [], 1, seed="s:0", slot=1) == drawn[1]
    assert len({json.dumps(d, sort_keys=True) for d in drawn}) > 1             # drawn, not one fixed fill

    cond = SearchSpace.from_mapping({"params": {
        "max_num_seqs": {"type": "int", "low": 16, "high": 512, "log": True, "default": 256},
        "stream_interval": {"type": "categorical", "choices": [1, 4, 16], "default": 1},
        "long_prefill_token_threshold": {"type": "categorical", "choices": [0, 512], "default": 0,
                                         "when": {"stream_interval": [1]}}}}, "t")
    pick = Pick({"max_num_seqs": 64, "long_prefill_token_threshold": 512}, 1, {}, ["stream_interval"])
    assert all(complete_pick(cond, pick, [], 1, seed="s:0", slot=i)["stream_interval"] == 1 for i in range(10))


def test_the_picks_spread_each_unmodelled_knob_over_its_values_and_studies_start_apart():
    """Both H200 studies of issue 24 (seed 0) filled their twin's #1 pick alike (TRITON_ATTN, stream
    interval 2, block size 16): the fill was drawn per pick rank. Now k picks of a study take k different
    values of each categorical knob the twin does not model, and the spread's start depends on the study."""
    from autotune.tuner.warmstart import Pick, complete_pick

    space = SearchSpace.from_mapping({"params": {
        "max_num_seqs": {"type": "int", "low": 16, "high": 512, "log": True, "default": 256},
        "attention_backend": {"type": "categorical", "choices": ["none", "FLASH_ATTN", "TRITON_ATTN"],
                              "default": "none"},
        "block_size": {"type": "categorical", "choices": [16, 32, 64, 128], "default": 16},
        "async_scheduling": {"type": "bool", "default": False}}}, "t")
    left = ["attention_backend", "block_size", "async_scheduling"]
    pick = Pick({"max_num_seqs": 64}, 1, {}, left)

    def fills(seed: str, k: int) -> list[dict]:
        return [complete_pick(space, pick, [], 1, seed=seed, slot=i) for i in range(k)]

    three = fills("chat:0", 3)
    assert len({f["attention_backend"] for f in three}) == 3 and len({f["block_size"] for f in three}) == 3
    assert len({f["async_scheduling"] for f in three[:2]}) == 2
    assert fills("chat:0", 3) == three                                   # the same study fills alike
    firsts = {json.dumps(fills(f"study-{n}:0", 1)[0], sort_keys=True) for n in range(12)}
    assert len(firsts) > 1                                               # other studies start elsewhere


def test_the_twins_capacity_step_runs_every_stream_it_offers() -> None:
    """A study's requests per step (64 in the decode study) below the step's concurrency: the twin still
    runs that many streams at once. Before, it sent 64 requests at 256 or 1,024 streams, read the same
    throughput and TPOT at every load past 64, and put a decode-heavy capacity at its cap of 1,024."""
    from autotune.sim.capacity import MAX_CONCURRENCY, at_capacity, capacity_curve, step
    from autotune.slo import SLO

    p = plan("llama-3.1-8b", ["--max-model-len", "4096"], "H100", 1)
    at64, at256 = (step(p, c, 128, 512, 64) for c in (64, 256))
    assert at256["metrics"]["completed"] >= 256 and at64["metrics"]["completed"] == 64
    assert at256["tps"] > 1.5 * at64["tps"] and at256["tpot50"] > at64["tpot50"]
    best = at_capacity(capacity_curve(p, SLO.parse("ttft:p99<=2s,tpot:p99<=20ms"), 128, 512, 64))
    assert best is not None and 256 <= best["c"] < MAX_CONCURRENCY


def test_the_twins_capacity_figure_leaves_out_the_drain_as_the_real_one_does() -> None:
    """At a study's 64 requests and 56 streams with max-num-seqs 56, a step is one wave and 8 more that
    decode nearly alone. The real capacity_tps counts the fully-loaded window only; the twin's counted
    the whole run and put this config at 3,715 tok/s where the H100 measured 6,373 with the twin's own
    TPOT (benchmarks/gpu/knobs, session 26). Now the figure is the full batch's rate, 56 streams / TPOT."""
    from autotune.sim.capacity import step
    from autotune.sim.inprocess import run

    p = plan("llama-3.1-8b", [*BASE, "--max-num-seqs", "56"], "H100", 1)
    s = step(p, 56, 128, 512, 64)
    full_batch = 56 * 1000.0 / s["tpot50"]
    assert s["metrics"]["output_throughput"] < 0.7 * full_batch       # the whole run, drain and all
    assert s["tps"] == pytest.approx(full_batch, rel=0.05)
    assert "steady_output_throughput" not in run(p, num_requests=64, input_len=128, output_len=512,
                                                 request_rate=4.0).metrics   # open loop: no such window
