"""A VLM's images in the memory model and the twin (issue 25): image tokens by the processors' own
rules (checked against transformers where it is installed), the encoder's weights and profiling in
the budget, the chunked-MM-input check, `estimate` with images, and the simulator's usage counts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from autotune import causes
from autotune.bench.images import data_uri, make_image
from autotune.perfmodel import plan
from autotune.perfmodel.profiles import load_profile
from autotune.perfmodel.vision import VisionProfile, load_vision
from autotune.sim.command import estimate_main
from autotune.sim.openai import BadRequest, ImageRules, parse_request
from autotune.slo import SLO

QWEN = load_profile("qwen2.5-vl-7b")
TINY_IDEFICS = VisionProfile("idefics3", patch_size=16, merge_size=2, depth=2, hidden_size=64, intermediate_size=128,
                             num_heads=2, out_hidden_size=128, tile=256, longest_edge=512)


def test_qwen_tokens_follow_smart_resize() -> None:
    v = QWEN.vision
    assert v.tokens(1024, 768) == 37 * 27 + 2              # 1036 x 756 pixels, 28-pixel tokens, start/end
    assert v.max_tokens_per_item() == 16384                 # max_pixels 12,845,056 = 16,384 x 28 x 28
    assert v.max_tokens_per_item({"max_pixels": 401408}) == 512    # vLLM 0.32: max_pixels // 28^2, factorized
    assert v.tokens(1024, 768, {"max_pixels": 401408}) < v.tokens(1024, 768)
    assert v.params == pytest.approx(0.676e9, rel=0.01)      # Qwen2.5-VL-7B's vision tower
    smart_resize = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl").smart_resize
    rng = random.Random(0)
    for _ in range(500):
        w, h = rng.randint(28, 5000), rng.randint(28, 5000)
        if max(w, h) / min(w, h) > 200:
            continue
        for mp in (None, 1003520):
            hh, ww = smart_resize(h, w, 28, 3136, mp or 12845056)
            assert v.resized(w, h, mp) == (ww, hh)


def test_idefics3_tiles_follow_the_processor() -> None:
    assert TINY_IDEFICS.tile_tokens == 64
    assert TINY_IDEFICS.grid(448, 448) == (2, 2) and TINY_IDEFICS.placeholders(448, 448) == 5 * 64
    assert TINY_IDEFICS.tokens(448, 448) == 5 * 64 + 2 * 4 + 2 + 1 + 3
    assert TINY_IDEFICS.grid(1024, 200) == (1, 2) and TINY_IDEFICS.placeholders(1024, 200) == 3 * 64
    mod = pytest.importorskip("transformers.models.idefics3.image_processing_pil_idefics3")
    proc = mod.Idefics3ImageProcessorPil(size={"longest_edge": 512}, max_image_size={"longest_edge": 256})
    rng = random.Random(1)
    for _ in range(500):
        w, h = rng.randint(1, 5000), rng.randint(1, 5000)
        n, rows, cols = proc.get_number_of_image_patches(h, w)
        assert TINY_IDEFICS.grid(w, h) == (rows, cols)
        assert TINY_IDEFICS.placeholders(w, h) == max(n, 1) * 64


def test_vision_is_read_from_a_model_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2_5_vl", "hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
        "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
                          "out_hidden_size": 256, "fullatt_block_indexes": [1], "window_size": 112}}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 200704, "min_pixels": 3136,
                                                                   "patch_size": 14, "merge_size": 2}))
    v = load_vision(tmp_path)
    assert v.family == "qwen2_vl" and v.max_tokens_per_item() == 256 and v.full_attention_layers == 1
    assert load_profile(str(tmp_path)).vision == v
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                                      "num_attention_heads": 2, "num_hidden_layers": 1}))
    assert load_vision(tmp_path) is None and load_profile(str(tmp_path)).vision is None


def _budget(*flags: str):
    return plan("qwen2.5-vl-7b", ["--max-model-len", "8192", *flags], "H200", 1)


def test_the_encoder_takes_weights_and_profiling_memory_from_the_kv_cache() -> None:
    vlm = _budget()
    text = plan("qwen2.5-vl-7b", ["--max-model-len", "8192", "--limit-mm-per-prompt", '{"image": 0}'], "H200", 1)
    assert vlm.budget.weights_gib - text.budget.weights_gib == pytest.approx(0.676e9 * 2 / 2**30, rel=0.01)
    assert vlm.budget.activation_gib > text.budget.activation_gib       # one 16,384-token image profiled
    assert vlm.budget.kv_cache_tokens < text.budget.kv_cache_tokens
    small = _budget("--mm-processor-kwargs", '{"max_pixels": 401408}')
    assert small.budget.kv_cache_tokens > vlm.budget.kv_cache_tokens     # a smaller largest image: less profiled
    skipped = _budget("--skip-mm-profiling")
    assert skipped.budget.activation_gib < vlm.budget.activation_gib


def test_chunked_mm_input_off_needs_the_largest_image_in_one_step() -> None:
    bad = _budget("--disable-chunked-mm-input", "--max-num-batched-tokens", "8192")
    assert not bad.budget.fits and bad.budget.cause == causes.BAD_CONFIG
    assert "max_tokens_per_mm_item (16384) is larger than max_num_batched_tokens (8192)" in bad.budget.reason
    assert _budget("--disable-chunked-mm-input", "--max-num-batched-tokens", "16384").budget.fits
    assert _budget("--disable-chunked-mm-input", "--max-num-batched-tokens", "8192",
                   "--mm-processor-kwargs", '{"max_pixels": 1003520}').budget.fits


def test_estimate_with_images(capsys: pytest.CaptureFixture[str]) -> None:
    code = estimate_main(["--gpu", "H200", "--model-profile", "qwen2.5-vl-7b", "--input-len", "128",
                          "--output-len", "32", "--image-size", "1024x768", "--images", "2", "--image-share", "0.5",
                          "--no-curve", "--json", "--", "--max-model-len", "8192"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["vision"]["image"]["tokens"] == 1001 and r["vision"]["max_tokens_per_image"] == 16384
    assert r["vision"]["weights_gib_per_gpu"] == pytest.approx(1.26, abs=0.01) and r["vision"]["image"]["encoder_ms"] > 0
    assert estimate_main(["--gpu", "H200", "--model-profile", "llama-3.1-8b", "--image-size", "64x64"]) == 2
    assert "no vision encoder" in capsys.readouterr().err


def _chat(*images: bytes, text: str = "describe the picture") -> dict:
    parts = [{"type": "image_url", "image_url": {"url": data_uri(img, "png")}} for img in images]
    return {"model": "m", "messages": [{"role": "user", "content": parts + [{"type": "text", "text": text}]}],
            "max_tokens": 4}


def test_simulator_counts_image_tokens_and_refuses_what_vllm_refuses() -> None:
    rules = ImageRules(QWEN.vision, {}, 2)
    plain = parse_request(_chat(), True, 32768, rules)
    one = parse_request(_chat(make_image(1024, 768, 1)), True, 32768, rules)
    assert len(one.prompt_tokens) - len(plain.prompt_tokens) == 1001 and one.images == [(1024, 768)]
    assert one.image_tokens == 1001
    with pytest.raises(BadRequest, match="At most 2 image"):
        parse_request(_chat(*(make_image(64, 64, i) for i in range(3))), True, 32768, rules)
    with pytest.raises(BadRequest, match="not a multimodal model"):
        parse_request(_chat(make_image(64, 64, 0)), True, 32768, ImageRules(None))
    with pytest.raises(BadRequest, match="maximum context length"):
        parse_request(_chat(make_image(1024, 768, 1)), True, 512, rules)


def test_twin_prefills_and_encodes_image_requests() -> None:
    from autotune.sim.inprocess import ImageMix, run

    p = _budget()
    text = run(p, num_requests=40, input_len=128, output_len=32, concurrency=4, seed=1)
    mixed = run(p, num_requests=40, input_len=128, output_len=32, concurrency=4, seed=1,
                images=ImageMix(0.5, (1, 2), ((1024, 768),)))
    m = mixed.metrics
    assert m["image_median_ttft_ms"] > m["text_median_ttft_ms"] + 40     # 1-2 images of 1,001 tokens to prefill
    assert m["total_input_tokens"] > text.metrics["total_input_tokens"] + 10 * 1001
    assert "image_median_ttft_ms" not in text.metrics
    from autotune.perfmodel.roofline import StepModel

    model = StepModel(p.profile, p.config, p.gpu)
    flops = QWEN.vision.flops(QWEN.vision.patches(1024, 768))
    plain, encoded = model.step(1, 1001, 1001, 1001 * 500, True), model.step(1, 1001, 1001, 1001 * 500, True, flops)
    assert encoded.compute_s - plain.compute_s == pytest.approx(flops / model.encoder_flops_rate)


def test_the_warm_start_twin_ranks_under_image_traffic() -> None:
    from autotune.space import SearchSpace
    from autotune.tuner.warmstart import twin_predictor

    space = SearchSpace.from_mapping({"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 256}}}, "inline")
    slo = SLO.parse("ttft=2s")
    text = twin_predictor("qwen2.5-vl-7b", "H200", 1, ["--max-model-len", "8192"], space,
                          {"kind": "random", "input_len": 256, "output_len": 64}, slo, requests=48)
    images = twin_predictor("qwen2.5-vl-7b", "H200", 1, ["--max-model-len", "8192"], space,
                            {"kind": "image", "input_len": 256, "output_len": 64, "share": 1.0, "images": 2,
                             "sizes": "1280x720"}, slo, requests=48)
    a, b = text({"max_num_seqs": 256}), images({"max_num_seqs": 256})
    assert b["capacity"] < a["capacity"]           # 2 x 1,198 image tokens a request: fewer streams meet 2 s
