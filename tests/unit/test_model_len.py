"""The model's own maximum length (as vLLM derives it) feeds the known-constraint check when no
`--max-model-len` fixes it: the issue's `max_num_batched_tokens (3055) is smaller than max_model_len
(4096)` is then rejected before launch instead of costing a start."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.space import SearchSpace, violations
from autotune.space.model_len import max_len_from_config, model_max_len

SPACE = {"params": {"max_num_batched_tokens": {"type": "int", "low": 512, "high": 8192},
                    "enable_chunked_prefill": {"type": "bool", "default": True}}}


def test_demo_model_length_is_what_vllm_reported(demo_model_dir: Path) -> None:
    # vLLM 0.32 on this model said "max_num_batched_tokens (512) is smaller than max_model_len (2048)"
    # (tests/fixtures/logs/cpu-vllm0.32-bad-config-batched-below-model-len.log)
    assert model_max_len(str(demo_model_dir)) == 2048
    assert model_max_len(str(demo_model_dir / "config.json")) == 2048


def test_vllms_rule_smallest_key_tokenizer_cap_rope_factor_text_config() -> None:
    assert max_len_from_config({"max_position_embeddings": 8192, "seq_length": 4096}) == 4096
    assert max_len_from_config({"n_positions": 1024}) == 1024
    assert max_len_from_config({"max_position_embeddings": 8192, "model_max_length": 16384}) == 16384  # Command-R
    assert max_len_from_config({"max_position_embeddings": 8192}, {"model_max_length": 4096}) == 4096
    assert max_len_from_config({"max_position_embeddings": 4096,
                                "rope_scaling": {"type": "linear", "factor": 4.0}}) == 16384
    assert max_len_from_config({"max_position_embeddings": 131072,
                                "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) == 131072  # prescaled
    assert max_len_from_config({"text_config": {"max_position_embeddings": 32768}, "vision_config": {}}) == 32768
    assert max_len_from_config({"hidden_size": 8}) is None
    assert max_len_from_config({"max_position_embeddings": True}) is None


def test_hub_ids_and_unreadable_configs_give_none(tmp_path: Path) -> None:
    assert model_max_len("meta-llama/Llama-3.1-8B") is None
    (tmp_path / "config.json").write_text("{not json")
    assert model_max_len(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    assert model_max_len(str(tmp_path)) is None


def test_the_models_length_judges_a_candidate_only_when_no_flag_fixes_it() -> None:
    chunked_off = {"max_num_batched_tokens": 3055, "enable_chunked_prefill": False}
    assert violations(chunked_off, 1) == []                          # length unknown: not judged
    assert violations(chunked_off, 1, model_max_len=4096) == [
        "max_num_batched_tokens (3055) < max_model_len (4096, the model's own from its config.json) "
        "with chunked prefill off"]
    assert violations({**chunked_off, "max_model_len": 2048}, 1, model_max_len=4096) == []   # the flag wins
    assert violations({**chunked_off, "max_model_len": -1}, 1, model_max_len=4096)           # auto-fit: at most the model's
    assert violations({**chunked_off, "enable_chunked_prefill": True}, 1, model_max_len=4096) == []
    space = SearchSpace.from_mapping(SPACE, "t").narrowed(1, False)
    space.model_max_len = 4096
    assert space.narrowed(1, False).model_max_len == 4096
    assert space.violations({"max_num_batched_tokens": 3055, "enable_chunked_prefill": False}, [], 1)
    assert not space.violations({"max_num_batched_tokens": 3055, "enable_chunked_prefill": False},
                                ["--max-model-len", "1024"], 1)
