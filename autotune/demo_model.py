"""A tiny random-weight Llama that vLLM can serve with no model hub: the CPU demo and the tests' model.

Its output is noise; it exists so that everything around the model (startup, memory sizing, the
scheduler, HTTP, the tuner) runs for real. The tokenizer is a byte-level BPE trained here on text
bundled with the package, so no download is needed. Weights are written with a small streaming
safetensors writer (numpy only, no torch) in bfloat16, which also lets an 8B-shaped model be written
for a GPU without holding it all in memory.

    >>> from autotune.demo_model import write_demo_model
    >>> path = write_demo_model("models/demo")          # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import struct
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from autotune.errors import UserError
from autotune.spec import RANDOM_WEIGHTS_MARKER

DEFAULT_SHAPE: dict[str, int] = {
    "hidden": 128,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 256,
    "max_position_embeddings": 2048,
    "vocab": 0,  # 0: the trained tokenizer's size
}
TOKENIZER_VOCAB = 512
SEED = 0
SHARD_BYTES = 4 * 1024**3
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def _atomic_write(path: Path, data: bytes | str) -> None:
    """Write then rename, so an interrupted run never leaves a file that looks complete."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def _corpus() -> list[str]:
    text = resources.files("autotune").joinpath("data/demo_corpus.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def train_tokenizer() -> Any:
    """The demo's byte-level BPE, trained on the bundled corpus (no download); the same for every call."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _write_tokenizer(out: Path, max_len: int) -> None:
    if not (out / "tokenizer.json").is_file():
        _atomic_write(out / "tokenizer.json", train_tokenizer().to_str(pretty=True))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    files = {
        "special_tokens_map.json": specials,
        "tokenizer_config.json": {
            **specials,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": max_len,
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "chat_template": CHAT_TEMPLATE,
        },
    }
    for name, content in files.items():
        if not (out / name).is_file():
            _atomic_write(out / name, _json(content))


def _token_ids(out: Path) -> tuple[int, dict[str, int]]:
    data = json.loads((out / "tokenizer.json").read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    ids = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    size = max([*vocab.values(), *ids.values()]) + 1
    return size, ids


def _config(shape: dict[str, int], token_ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape["hidden"],
        "intermediate_size": shape["intermediate"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "head_dim": shape["hidden"] // shape["heads"],
        "max_position_embeddings": shape["max_position_embeddings"],
        "vocab_size": shape["vocab"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": token_ids["<s>"],
        "eos_token_id": token_ids["</s>"],
    }


def _tensor_shapes(shape: dict[str, int]) -> Iterator[tuple[str, tuple[int, ...]]]:
    h, inter, vocab = shape["hidden"], shape["intermediate"], shape["vocab"]
    hd = h // shape["heads"]
    q, kv = shape["heads"] * hd, shape["kv_heads"] * hd
    yield "model.embed_tokens.weight", (vocab, h)
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (inter, h)
        yield p + "mlp.up_proj.weight", (inter, h)
        yield p + "mlp.down_proj.weight", (h, inter)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (vocab, h)


def _bf16_values(name: str, dims: tuple[int, ...], rng: np.random.Generator) -> Iterator[bytes]:
    """Norms are ones; matrices N(0, 0.02), produced in row chunks to bound memory for big shapes."""
    if len(dims) == 1:
        yield np.full(dims, 0x3F80, dtype="<u2").tobytes()  # 1.0 in bfloat16
        return
    rows, cols = dims
    step = max(1, (1 << 24) // cols)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        block = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(0.02)
        # bfloat16 = the high 16 bits of float32 (truncation; fine for random weights)
        yield (block.view("<u4") >> 16).astype("<u2").tobytes()


def _write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in tensors:
        size = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, dims in tensors:
            for chunk in _bf16_values(name, dims, rng):
                f.write(chunk)
    os.replace(tmp, path)


def _write_weights(out: Path, shape: dict[str, int]) -> None:
    """One file when small; shards of about SHARD_BYTES plus an index when large (as HF does)."""
    rng = np.random.default_rng(SEED)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in _tensor_shapes(shape):
        nbytes = int(np.prod(dims)) * 2
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += nbytes
    if len(shards) == 1:
        _write_safetensors(out / "model.safetensors", shards[0], rng)
        return
    weight_map: dict[str, str] = {}
    total = 0
    for i, tensors in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        if not (out / fname).is_file():
            _write_safetensors(out / fname, tensors, np.random.default_rng([SEED, i]))
        for name, dims in tensors:
            weight_map[name] = fname
            total += int(np.prod(dims)) * 2
    _atomic_write(out / "model.safetensors.index.json", _json({"metadata": {"total_size": total}, "weight_map": weight_map}))


def _resolve_shape(shape: dict[str, int] | None, tokenizer_size: int) -> dict[str, int]:
    merged = dict(DEFAULT_SHAPE)
    for key, value in (shape or {}).items():
        if key not in DEFAULT_SHAPE:
            raise UserError(f"unknown demo model shape key {key!r} (known: {', '.join(DEFAULT_SHAPE)})")
        if not isinstance(value, int) or value < 0:
            raise UserError(f"demo model shape {key} must be a non-negative integer, got {value!r}")
        merged[key] = value
    if merged["vocab"] == 0:
        merged["vocab"] = tokenizer_size
    if merged["vocab"] < tokenizer_size:
        raise UserError(f"demo model vocab {merged['vocab']} is below the tokenizer's {tokenizer_size} tokens")
    if merged["hidden"] % merged["heads"] or merged["heads"] % max(merged["kv_heads"], 1) or merged["kv_heads"] < 1:
        raise UserError(f"demo model shape: hidden {merged['hidden']} must divide by heads {merged['heads']}, "
                        f"which must divide by kv_heads {merged['kv_heads']}")
    return merged


RANDOM_WEIGHTS_NOTE = ("random weights: output text is noise, so speculative decoding's acceptance rate here "
                       "says nothing about real text (autotune labels such figures)\n")


def write_demo_model(dir: str | Path, shape: dict[str, int] | None = None) -> Path:
    """Write (or complete) the demo model in `dir`; return its path. Deterministic for a given shape.

    A complete directory is left alone; a directory holding a different shape is refused rather than
    silently mixed (its weights would not match its config).
    """
    out = Path(dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"demo model path {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create demo model directory {out}: {exc.strerror}") from None
    pre = _resolve_shape(shape, 1)
    _write_tokenizer(out, pre["max_position_embeddings"])
    tokenizer_size, token_ids = _token_ids(out)
    full = _resolve_shape(shape, tokenizer_size)
    config = _config(full, token_ids)
    config_path = out / "config.json"
    if config_path.is_file():
        existing = json.loads(config_path.read_text())
        if existing != config:
            raise UserError(f"{out} already holds a different model (its config.json differs); use another directory")
    else:
        _atomic_write(config_path, _json(config))
    if not (out / "generation_config.json").is_file():
        gen = {"bos_token_id": token_ids["<s>"], "eos_token_id": token_ids["</s>"], "do_sample": False}
        _atomic_write(out / "generation_config.json", _json(gen))
    if not any((out / name).is_file() for name in _WEIGHT_FILES):
        _write_weights(out, full)
    if not (out / RANDOM_WEIGHTS_MARKER).is_file():   # what a speculative-decoding figure is labelled by
        _atomic_write(out / RANDOM_WEIGHTS_MARKER, RANDOM_WEIGHTS_NOTE)
    return out
