"""The model's own maximum length, as vLLM derives it when no `--max-model-len` fixes it.

The known-constraint check needs it: with chunked prefill off, vLLM refuses `max_num_batched_tokens`
below the maximum length, and when the study leaves `--max-model-len` to vLLM that length comes from
the model's config.json, not from any flag. Reading it here lets the candidate be rejected for free
instead of after a launch that costs a minute (or, on a GPU, loading the weights).

The rule follows vLLM (`derive_max_model_len_and_key` and `_get_and_verify_max_len` in vllm/config):
the smallest of the length keys below, `model_max_length` overriding them, the tokenizer's
`model_max_length` as an upper bound, and a RoPE scaling factor applied except for the RoPE types whose
max_position_embeddings is already scaled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_PRESCALED_ROPE = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _rope_factor(cfg: dict[str, Any]) -> float:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return 1.0
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind in _PRESCALED_ROPE:
        return 1.0
    return _number(rope.get("factor")) or 1.0


def max_len_from_config(cfg: dict[str, Any], tokenizer_cfg: dict[str, Any] | None = None) -> int | None:
    """vLLM's derived maximum length for a parsed config.json; None when it names none (vLLM then
    assumes 2048 with a warning, which we do not second-guess)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    found = [n for n in (_number(text.get(k)) for k in _LENGTH_KEYS) if n is not None]
    if not found:
        return None
    length = _number(text.get("model_max_length")) or min(found)
    limit = _number((tokenizer_cfg or {}).get("model_max_length"))
    if limit is not None:
        length = min(length, limit)
    return int(length * _rope_factor(text))


def model_max_len(model: str) -> int | None:
    """The maximum length of a local model directory (or a config.json path); None for a hub id or a
    directory without a readable config (vLLM will say what it thinks at launch)."""
    path = Path(model).expanduser()
    config = path / "config.json" if path.is_dir() else path
    if config.name != "config.json" or not config.is_file():
        return None
    cfg = _read_json(config)
    if cfg is None:
        return None
    return max_len_from_config(cfg, _read_json(config.parent / "tokenizer_config.json"))
