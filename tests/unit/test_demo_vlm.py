"""The random-weight VLMs (issue 25): written with transformers, nothing downloaded, with the demo
tokenizer plus the architecture's image tokens; transformers loads them back whole, and autotune's
vision profile reads their processor settings. The 7B shape is checked on its config alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.demo_vlm import qwen_config, write_demo_vlm
from autotune.errors import UserError
from autotune.perfmodel.profiles import load_profile

pytest.importorskip("transformers")


def test_a_tiny_qwen2_5_vl_loads_back_whole_with_its_image_tokens(tmp_path: Path) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    out = write_demo_vlm(tmp_path / "q", "qwen2_5_vl")
    cfg = json.loads((out / "config.json").read_text())
    tok = json.loads((out / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert cfg["image_token_id"] == added["<|image_pad|>"] and cfg["vision_start_token_id"] == added["<|vision_start|>"]
    assert cfg["model_type"] == "qwen2_5_vl" and "hidden_size" in cfg          # the flat form Qwen ships
    _, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    vision = load_profile(str(out)).vision
    assert vision.family == "qwen2_vl" and vision.max_tokens_per_item() == 256   # max_pixels 200,704
    assert write_demo_vlm(out, "qwen2_5_vl") == out                              # complete: left alone
    with pytest.raises(UserError, match="another model"):
        write_demo_vlm(out, "idefics3")


def test_the_7b_shape_is_qwen2_5_vl_7b(tmp_path: Path) -> None:
    ids = {t: i for i, t in enumerate(["<s>", "</s>", "<unk>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                      "<|video_pad|>"])}
    raw, max_pixels = qwen_config("7b", ids, 516)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": max_pixels, "min_pixels": 3136}))
    p = load_profile(str(tmp_path))
    ref = load_profile("qwen2.5-vl-7b")
    assert p.total_params == pytest.approx(ref.total_params) and p.vision.params == pytest.approx(ref.vision.params)
    assert 7e9 < p.total_params + p.vision.params < 9e9                        # 8.3B in all
    assert p.vision.max_tokens_per_item() == 16384
