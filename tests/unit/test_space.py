import optuna
import pytest

from autotune.errors import UserError
from autotune.space import SearchSpace, flags_to_mapping, mapping_to_flags, violations

SPACE = {
    "params": {
        "max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True, "default": 256},
        "max_num_batched_tokens": {"type": "int", "low": 512, "high": 8192, "step": 512},
        "gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95, "step": 0.05, "default": 0.9},
        "enable_chunked_prefill": {"type": "bool", "default": True},
        "tensor_parallel_size": {"type": "categorical", "choices": [1, 2, 4], "default": 1, "requires_gpus": 2},
        "enable_expert_parallel": {"type": "bool", "default": False, "when": {"tensor_parallel_size": [2, 4]}},
        "kv_cache_dtype": {"type": "categorical", "choices": ["auto", "fp8"], "quality": True},
        "quantization": {"type": "categorical", "choices": ["none", "fp8"], "default": "none"},
    },
    "fixed": {"max_model_len": 4096, "enforce_eager": True},
}


def test_render_booleans_and_none_choice():
    space = SearchSpace.from_mapping(SPACE, "t")
    flags = space.render({"enable_chunked_prefill": False, "quantization": "none", "max_num_seqs": 64,
                          "gpu_memory_utilization": 0.85})
    assert flags == ["--no-enable-chunked-prefill", "--max-num-seqs", "64", "--gpu-memory-utilization", "0.85"]
    assert space.render({"enable_chunked_prefill": True}) == ["--enable-chunked-prefill"]
    assert space.fixed_flags == ["--max-model-len", "4096", "--enforce-eager"]


def test_narrowing_drops_gpu_and_quality_knobs():
    one = SearchSpace.from_mapping(SPACE, "t").narrowed(1, False)
    assert "tensor_parallel_size" not in one.params and "enable_expert_parallel" not in one.params
    assert "kv_cache_dtype" not in one.params
    two = SearchSpace.from_mapping(SPACE, "t").narrowed(2, ["kv_cache_dtype"])
    assert two.params["tensor_parallel_size"].choices == (1, 2)
    assert "kv_cache_dtype" in two.params
    assert one.fingerprint() != two.fingerprint()


def test_conditional_param_sampled_only_when_active():
    space = SearchSpace.from_mapping(SPACE, "t").narrowed(4, False)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_tp = set()
    for _ in range(40):
        trial = study.ask()
        params = space.suggest(trial)
        seen_tp.add(params["tensor_parallel_size"])
        assert ("enable_expert_parallel" in params) == (params["tensor_parallel_size"] > 1)
        assert 8 <= params["max_num_seqs"] <= 512 and params["max_num_batched_tokens"] % 512 == 0
        study.tell(trial, 0.0)
    assert seen_tp == {1, 2, 4}


def test_an_enqueued_conditional_knob_runs_under_its_parents_default():
    """An enqueued candidate that names a conditional knob but not its parent (the H200 long-prompt
    study's `{long_prefill_token_threshold: 512}`) ran the engine's defaults: the parent, never sampled,
    read as absent and switched the knob off. The parent left out runs at its default, which decides."""
    space = SearchSpace.from_mapping({"params": {
        "enable_chunked_prefill": {"type": "bool", "default": True},
        "long_prefill_token_threshold": {"type": "categorical", "choices": [0, 512, 1024], "default": 0,
                                         "when": {"enable_chunked_prefill": [True]}},
        "tensor_parallel_size": {"type": "categorical", "choices": [1, 2], "default": 1},
        "enable_expert_parallel": {"type": "bool", "default": False, "when": {"tensor_parallel_size": [2]}}}},
        "t")
    study = optuna.create_study()
    study.enqueue_trial({"long_prefill_token_threshold": 512})
    trial = study.ask()
    assert space.suggest(trial, only=["long_prefill_token_threshold"]) == {"long_prefill_token_threshold": 512}
    assert space.render({"long_prefill_token_threshold": 512}) == ["--long-prefill-token-threshold", "512"]
    assert space.inactive({"long_prefill_token_threshold": 512}) == []
    # a value its own candidate (or a parent's default) switches off would never be sent: refused
    assert space.inactive({"enable_chunked_prefill": False, "long_prefill_token_threshold": 512}) == [
        "long_prefill_token_threshold applies only when enable_chunked_prefill is one of [True]"]
    assert space.inactive({"enable_expert_parallel": True}) == [
        "enable_expert_parallel applies only when tensor_parallel_size is one of [2]"]
    assert space.inactive({"tensor_parallel_size": 2, "enable_expert_parallel": True}) == []


def test_baseline_params_are_known_defaults_only():
    space = SearchSpace.from_mapping(SPACE, "t").narrowed(1, False)
    assert space.baseline_params() == {"max_num_seqs": 256, "gpu_memory_utilization": 0.9,
                                       "enable_chunked_prefill": True, "quantization": "none"}


def test_known_constraints():
    assert violations({"max_num_seqs": 256, "max_num_batched_tokens": 128}, 1) == [
        "max_num_batched_tokens (128) < max_num_seqs (256)"]
    out = violations({"max_num_batched_tokens": "2048", "max_model_len": "4096", "enable_chunked_prefill": False}, 1)
    assert out and "chunked prefill off" in out[0]
    assert violations({"max_num_batched_tokens": 2048, "max_model_len": 4096, "enable_chunked_prefill": True}, 1) == []
    assert "8 GPUs > 4 given" in violations({"tensor_parallel_size": 4, "data_parallel_size": 2}, 4)[0]
    space = SearchSpace.from_mapping(SPACE, "t").narrowed(1, False)
    assert space.violations({"max_num_batched_tokens": 1024, "enable_chunked_prefill": False},
                            space.fixed_flags, 1)


def test_flag_list_round_trip():
    flags = ["--max-model-len", "1024", "--enforce-eager", "--no-enable-prefix-caching", "--dtype=bfloat16"]
    m = flags_to_mapping(flags)
    assert m == {"max_model_len": "1024", "enforce_eager": True, "enable_prefix_caching": False, "dtype": "bfloat16"}
    assert mapping_to_flags({"enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 1024}) == [
        "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len", "1024"]


def test_every_emitted_flag_is_listed_for_the_help_check():
    space = SearchSpace.from_mapping(SPACE, "t")
    names = space.flag_names()
    assert "--enable-chunked-prefill" in names and "--no-enable-chunked-prefill" in names


@pytest.mark.parametrize("bad,needle", [
    ({"params": {"x": {"type": "int", "low": 5, "high": 1}}}, "above high"),
    ({"params": {"x": {"type": "float", "low": 0, "high": 1, "log": True}}}, "log range"),
    ({"params": {"x": {"type": "weird"}}}, "type must be"),
    ({"params": {"x": {"type": "int", "low": 1, "high": 2, "bogus": 1}}}, "unknown key"),
    ({"params": {"x": {"type": "bool", "when": {"y": [1]}}}}, "unknown param"),
    ({"params": {}}, "non-empty"),
    ({"params": {"x": {"type": "categorical", "choices": []}}}, "non-empty list"),
])
def test_bad_spaces_are_one_line_errors(bad, needle):
    with pytest.raises(UserError) as e:
        SearchSpace.from_mapping(bad, "t")
    assert needle in str(e.value)


def test_shipped_spaces_load():
    for name in ("default", "cpu"):
        space = SearchSpace.load(name)
        assert space.params
    with pytest.raises(UserError, match="not found"):
        SearchSpace.load("no-such-space")


def test_composite_layouts_never_ask_for_more_gpus_than_given():
    space = SearchSpace.load("default")
    four = space.narrowed(4, False).params["parallel_layout"]
    assert set(four.choices) == {"tp1", "tp2", "dp2", "tp4", "tp2-dp2", "tp2-ep", "tp4-ep",
                                 "1p1d", "1p2d", "2p1d", "1p1d-tp2"}   # PD splits: (P + D) x TP GPUs
    assert "parallel_layout" not in space.narrowed(1, False).params
    moe = SearchSpace.load("sim-moe").narrowed(8, False)
    assert moe.render({"parallel_layout": "tp4-dp2-ep"}) == [
        "--tensor-parallel-size", "4", "--data-parallel-size", "2", "--enable-expert-parallel"]
    assert moe.violations({"parallel_layout": "tp4-dp2-ep", "max_num_seqs": 64, "max_num_batched_tokens": 4096},
                          [], 8) == []
    names = moe.flag_names()
    assert "--enable-expert-parallel" in names and "--parallel-layout" not in names
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(30):
        trial = study.ask()
        params = moe.suggest(trial)
        assert not moe.violations(params, [], 8) or params["max_num_batched_tokens"] < params["max_num_seqs"]
        study.tell(trial, 0.0)


OLD_DEFAULT_ONE_GPU = {"params": {
    "gpu_memory_utilization": {"type": "float", "low": 0.80, "high": 0.97, "step": 0.01, "default": 0.92},
    "max_num_seqs": {"type": "int", "low": 16, "high": 1024, "log": True, "default": 1024},
    "max_num_batched_tokens": {"type": "int", "low": 1024, "high": 32768, "log": True, "default": 8192},
    "enable_chunked_prefill": {"type": "bool", "default": True},
    "enable_prefix_caching": {"type": "bool", "default": True}}}


def test_spaces_without_the_new_keys_keep_their_fingerprint():
    # resumed studies compare fingerprints: new keys (composite choices, env, opt_in, json) must not move a
    # space that uses none of them. The default space itself grew (issue 24): its fingerprint moved on purpose.
    assert SearchSpace.from_mapping(OLD_DEFAULT_ONE_GPU, "t").narrowed(1, False).fingerprint() == "7f44934b2792ec0b"
    assert SearchSpace.load("default").narrowed(1, False).fingerprint() != "7f44934b2792ec0b"
