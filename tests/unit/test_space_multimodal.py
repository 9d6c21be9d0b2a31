"""The multimodal knobs (issue 25): joined to a VLM study's space from search_spaces/multimodal.yaml,
rendered as vLLM's flags, max_pixels only with the quality opt-in and only for the Qwen2-VL family, and
their known constraints (images per prompt against the workload, an image within the step's budget)."""

from __future__ import annotations

from autotune.perfmodel.profiles import load_profile
from autotune.space import SearchSpace
from autotune.space.multimodal import MultimodalContext, image_limit_of, with_multimodal
from autotune.space.constraints import violations
from autotune.perfmodel.vision import VisionProfile

QWEN = load_profile("qwen2.5-vl-7b").vision
IDEFICS = VisionProfile("idefics3", 16, 2, 2, 64, 128, 2, 128, tile=256, longest_edge=512)
MM = ("limit_mm_per_prompt", "mm_processor_cache_gb", "mm_encoder_tp_mode", "disable_chunked_mm_input", "mm_max_pixels")


def test_a_vlm_gets_the_multimodal_knobs_and_a_text_space_is_untouched() -> None:
    base = SearchSpace.load("default")
    joined = with_multimodal(base, QWEN)
    assert set(joined.params) == set(base.params) | set(MM) and set(base.params).isdisjoint(MM)
    one_gpu = joined.narrowed(1, False)
    assert "mm_encoder_tp_mode" not in one_gpu.params and "mm_max_pixels" not in one_gpu.params
    assert "mm_max_pixels" in joined.narrowed(1, ["mm_max_pixels"]).params          # opt-in: it changes output
    assert "mm_max_pixels" not in with_multimodal(base, IDEFICS).params             # Qwen2-VL's processor only
    own = SearchSpace.from_mapping({"params": {"disable_chunked_mm_input": {"type": "bool"}}}, "inline")
    assert with_multimodal(own, QWEN) is own                                         # the study chose its own
    assert joined.fingerprint() != base.fingerprint()


def test_knobs_render_as_vllm_flags() -> None:
    s = with_multimodal(SearchSpace.load("cpu"), QWEN)
    flags = s.render({"limit_mm_per_prompt": "img2", "mm_processor_cache_gb": 0, "disable_chunked_mm_input": True,
                      "mm_max_pixels": "px-400k"})
    assert flags == ["--limit-mm-per-prompt", '{"image": 2}', "--mm-processor-cache-gb", "0",
                     "--disable-chunked-mm-input", "--mm-processor-kwargs", '{"max_pixels": 401408}']
    assert s.render({"limit_mm_per_prompt": "default", "mm_max_pixels": "default"}) == []
    assert s.baseline_params()["limit_mm_per_prompt"] == "default"      # the baseline launches without them
    assert {"--limit-mm-per-prompt", "--mm-processor-cache-gb", "--disable-chunked-mm-input",
            "--no-disable-chunked-mm-input", "--mm-processor-kwargs"} <= set(s.flag_names())
    assert image_limit_of('{"image": 3}') == 3 and image_limit_of('{"image": {"count": 2}}') == 2
    assert image_limit_of(None) is None and image_limit_of("not json") is None


def test_known_constraints_of_the_multimodal_knobs() -> None:
    mm = MultimodalContext(QWEN, max_images=2)
    few = violations({"limit_mm_per_prompt": '{"image": 1}'}, 1, None, mm)
    assert few == ["limit_mm_per_prompt allows 1 image(s) per prompt, the workload sends up to 2"]
    assert violations({"limit_mm_per_prompt": '{"image": 2}'}, 1, None, mm) == []
    small = violations({"disable_chunked_mm_input": True, "max_num_batched_tokens": "8192"}, 1, None, mm)
    assert small == ["max_num_batched_tokens (8192) < the largest image's 16384 tokens with chunked MM input off"]
    assert violations({"disable_chunked_mm_input": True, "max_num_batched_tokens": "8192",
                       "mm_processor_kwargs": '{"max_pixels": 1003520}'}, 1, None, mm) == []
    assert violations({"disable_chunked_mm_input": False, "max_num_batched_tokens": "1024"}, 1, None, mm) == []
    assert violations({"limit_mm_per_prompt": '{"image": 1}'}, 1, None, None) == []     # a text model: no rule
    space = with_multimodal(SearchSpace.load("cpu"), QWEN)
    space.multimodal = mm
    assert space.violations({"limit_mm_per_prompt": "img1"}, [], 1) == few
