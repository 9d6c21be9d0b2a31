"""The demo model: loadable by transformers, deterministic, idempotent, and safe on bad paths."""

import json
import os
import struct

import numpy as np
import pytest

from autotune.demo_model import write_demo_model
from autotune.errors import UserError

FILES = {"RANDOM_WEIGHTS", "config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
         "tokenizer.json", "tokenizer_config.json"}


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def test_writes_a_llama_with_the_asked_shape_and_its_own_tokenizer(tmp_path):
    out = write_demo_model(tmp_path / "demo")
    assert {p.name for p in out.iterdir()} == FILES
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["max_position_embeddings"]) == (2, 128, 4, 2, 256, 2048)
    assert cfg["vocab_size"] == 512  # the BPE trainer reached its target on the bundled text
    tensors = header(out / "model.safetensors")
    assert tensors["model.embed_tokens.weight"]["shape"] == [512, 128]
    assert tensors["model.layers.1.self_attn.k_proj.weight"]["shape"] == [64, 128]  # 2 kv heads x 32
    assert tensors["model.layers.0.mlp.down_proj.weight"]["shape"] == [128, 256]
    assert {t["dtype"] for k, t in tensors.items() if k != "__metadata__"} == {"BF16"}
    assert len(tensors) - 1 == 1 + 2 * 9 + 2


def bf16_tensor(path, name):
    meta = header(path)[name]
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        start, end = meta["data_offsets"]
        f.seek(8 + n + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    return (raw.astype("<u4") << 16).view("<f4").reshape(meta["shape"])


def test_transformers_loads_the_tokenizer_and_weights_are_sane(tmp_path):
    transformers = pytest.importorskip("transformers")

    out = write_demo_model(tmp_path / "demo")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "The tuner starts a server; 13 times 17 is 221."
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # merges were learned, not just bytes
    assert tok.eos_token == "</s>" and tok.eos_token_id == json.loads((out / "config.json").read_text())["eos_token_id"]
    assert "assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                  add_generation_prompt=True)
    emb = bf16_tensor(out / "model.safetensors", "model.embed_tokens.weight")
    assert emb.shape == (512, 128) and np.isfinite(emb).all()
    assert 0.018 < float(emb.std()) < 0.022 and abs(float(emb.mean())) < 0.002
    assert (bf16_tensor(out / "model.safetensors", "model.norm.weight") == 1.0).all()


def test_deterministic_and_a_complete_dir_is_left_alone(tmp_path):
    a = write_demo_model(tmp_path / "a")
    b = write_demo_model(tmp_path / "b")
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    stamp = {n: (a / n).stat().st_mtime_ns for n in FILES}
    write_demo_model(a)
    assert {n: (a / n).stat().st_mtime_ns for n in FILES} == stamp


def test_a_partial_dir_is_completed(tmp_path):
    ref = write_demo_model(tmp_path / "ref")
    part = write_demo_model(tmp_path / "part")
    os.remove(part / "model.safetensors")
    os.remove(part / "tokenizer_config.json")
    (part / "model.safetensors.tmp").write_bytes(b"half-written")  # an interrupted earlier run
    write_demo_model(part)
    assert (part / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()
    assert (part / "tokenizer_config.json").is_file()


def test_shape_override_for_bigger_models(tmp_path):
    out = write_demo_model(tmp_path / "big", shape={"hidden": 256, "layers": 3, "heads": 8, "kv_heads": 4,
                                                    "intermediate": 512, "vocab": 1024})
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["head_dim"], cfg["num_hidden_layers"]) == (1024, 32, 3)
    tensors = header(out / "model.safetensors")
    assert tensors["lm_head.weight"]["shape"] == [1024, 256]
    assert tensors["model.layers.2.self_attn.k_proj.weight"]["shape"] == [128, 256]
    size = (out / "model.safetensors").stat().st_size
    params = sum(int(np.prod(t["shape"])) for k, t in tensors.items() if k != "__metadata__")
    assert size - params * 2 < 4096  # header only beyond the bf16 payload


def test_sharded_when_large(tmp_path, monkeypatch):
    import autotune.demo_model as dm

    monkeypatch.setattr(dm, "SHARD_BYTES", 200_000)
    out = write_demo_model(tmp_path / "sharded")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and not (out / "model.safetensors").exists()
    assert sum((out / s).stat().st_size for s in shards) > index["metadata"]["total_size"]
    assert set(index["weight_map"]) == {k for s in shards for k in header(out / s) if k != "__metadata__"}


@pytest.mark.parametrize("shape, words", [
    ({"hidden": 130}, "must divide"),
    ({"vocab": 100}, "below the tokenizer"),
    ({"depth": 3}, "unknown demo model shape key"),
    ({"layers": -1}, "non-negative integer"),
])
def test_bad_shapes_are_user_errors(tmp_path, shape, words):
    with pytest.raises(UserError, match=words):
        write_demo_model(tmp_path / "x", shape=shape)


def test_bad_paths_are_user_errors(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("not a dir")
    with pytest.raises(UserError, match="not a directory"):
        write_demo_model(afile)
    write_demo_model(tmp_path / "d")
    with pytest.raises(UserError, match="different model"):
        write_demo_model(tmp_path / "d", shape={"layers": 3})
