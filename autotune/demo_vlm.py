"""Random-weight vision-language models that vLLM serves, made here with transformers (nothing
downloaded): the tuner's VLM demo and test model, and a 7B-class one for a GPU.

Two architectures, each written with its own processor settings and the demo's BPE tokenizer (plus the
architecture's image tokens as added special tokens) and the demo's chat template:

- `idefics3` (the Idefics3 / SmolVLM architecture): the CPU build's VLM. vLLM 0.32's Qwen2-VL family
  cannot load on the CPU build here: its model file imports transformers' torchvision-backed Qwen2-VL
  image processor (`from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize`),
  and PyPI's torchvision breaks `import transformers` beside the CPU torch, so it is uninstalled
  (Makefile). Idefics3's modules import without torchvision and its PIL image processor is used.
- `qwen2_5_vl` (Qwen2.5-VL): for a GPU host, where vLLM comes with torchvision. `--size 7b` is
  Qwen2.5-VL-7B-Instruct's shape (7.6B language model, 0.68B vision encoder, vocabulary 152,064).

The text demo model (demo_model.py) writes its weights with numpy alone; these need torch and
transformers, which are present wherever vLLM is. The output is noise: serve it with `ignore_eos`.

    autotune demo-model models/demo-vlm --vlm idefics3
    autotune demo-model /tmp/qwen2.5-vl-7b --vlm qwen2_5_vl --size 7b      # on the GPU host (~17 GB)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.demo_model import CHAT_TEMPLATE, SPECIAL_TOKENS, train_tokenizer
from autotune.errors import UserError

ARCHS = ("idefics3", "qwen2_5_vl")
SIZES = ("tiny", "7b")
SEED = 0
_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# Idefics3's tokens: <image> placeholders, the fake token around each tile, the global view's tag and
# the tile tags (<row_1_col_1> .. <row_6_col_6>), each one token, as in SmolVLM's own tokenizer.
_IDEFICS_TOKENS = (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
                   + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])
_QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Idefics3, tiny: 256-pixel tiles of 16-pixel patches, pixel shuffle 2: 64 tokens a tile; images are
# scaled to a 512-pixel longest edge, so at most 2 x 2 tiles and the global view (320 tokens).
IDEFICS_TILE, IDEFICS_PATCH, IDEFICS_SCALE = 256, 16, 2
# Qwen2.5-VL, tiny: at most 256 tokens an image (max_pixels 200,704 = 256 x 28 x 28).
QWEN_TINY_MAX_PIXELS = 200704


def _need_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as e:
        raise UserError(f"writing a VLM needs torch and transformers (installed with vLLM): {e}") from None
    return torch, transformers


def _tokenizer(out: Path, extra: list[str]) -> tuple[dict[str, int], int]:
    """The demo BPE plus the architecture's image tokens, saved; (ids of the special tokens, vocabulary size)."""
    from tokenizers import AddedToken

    tok = train_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in extra])
    tok.save(str(out / "tokenizer.json"))
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + extra}, tok.get_vocab_size()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _tokenizer_files(out: Path, max_len: int, processor_class: str) -> None:
    _write_json(out / "tokenizer_config.json", {**_SPECIALS, "tokenizer_class": "PreTrainedTokenizerFast",
                                                "model_max_length": max_len, "clean_up_tokenization_spaces": False,
                                                "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
                                                "processor_class": processor_class})
    _write_json(out / "special_tokens_map.json", _SPECIALS)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _idefics3(out: Path, size: str) -> None:
    torch, tf = _need_torch()
    if size != "tiny":
        raise UserError("idefics3: only --size tiny is made here (the CPU build's test model)")
    ids, vocab = _tokenizer(out, _IDEFICS_TOKENS)
    cfg = tf.Idefics3Config(
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           image_size=IDEFICS_TILE, patch_size=IDEFICS_PATCH),
        text_config=dict(model_type="llama", vocab_size=vocab, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
                         pad_token_id=ids["<unk>"]),
        image_token_id=ids["<image>"], scale_factor=IDEFICS_SCALE, pad_token_id=ids["<unk>"],
        tie_word_embeddings=False)
    torch.manual_seed(SEED)
    tf.Idefics3ForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(out)
    seq = (IDEFICS_TILE // IDEFICS_PATCH) ** 2 // IDEFICS_SCALE ** 2
    _write_json(out / "processor_config.json", {
        "processor_class": "Idefics3Processor", "image_seq_len": seq,
        "image_processor": {"image_processor_type": "Idefics3ImageProcessor", "do_convert_rgb": True,
                            "do_image_splitting": True, "do_normalize": True, "do_pad": True, "do_rescale": True,
                            "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                            "max_image_size": {"longest_edge": IDEFICS_TILE}, "resample": 1,
                            "rescale_factor": 1 / 255, "size": {"longest_edge": 2 * IDEFICS_TILE}}})
    _tokenizer_files(out, 4096, "Idefics3Processor")


def _qwen_shape(size: str, vocab: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(text config, vision config, max_pixels)."""
    if size == "7b":   # Qwen2.5-VL-7B-Instruct's config.json and preprocessor_config.json
        return (dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000,
                     rms_norm_eps=1e-6, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                     rope_theta=1e6),
                dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=3584,
                     fullatt_block_indexes=[7, 15, 23, 31], hidden_act="silu", in_chans=3, tokens_per_second=2),
                12845056)
    return (dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                 rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}, rope_theta=1e6),
            dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=14, spatial_merge_size=2,
                 temporal_patch_size=2, window_size=112, out_hidden_size=128, fullatt_block_indexes=[1],
                 hidden_act="silu", in_chans=3, tokens_per_second=2),
            QWEN_TINY_MAX_PIXELS)


def qwen_config(size: str, ids: dict[str, int], vocab: int) -> tuple[dict[str, Any], int]:
    """(config.json, max_pixels) of the Qwen2.5-VL model of `size`: the flat form Qwen's checkpoints ship
    (text keys at the top, vision_config nested), which transformers 4.5x and 5.x and vLLM all read."""
    text, vision, max_pixels = _qwen_shape(size, vocab)
    return {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
            **text, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "image_token_id": ids["<|image_pad|>"],
            "video_token_id": ids["<|video_pad|>"], "vision_start_token_id": ids["<|vision_start|>"],
            "vision_end_token_id": ids["<|vision_end|>"], "vision_config": vision}, max_pixels


def _qwen2_5_vl(out: Path, size: str) -> None:
    """Weights from transformers' own model class (on the GPU when there is one: seconds for 8B)."""
    torch, tf = _need_torch()
    ids, vocab = _tokenizer(out, _QWEN_TOKENS)
    raw, max_pixels = qwen_config(size, ids, vocab)
    cfg = tf.Qwen2_5_VLConfig.from_dict(raw)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(SEED)
    with torch.device(device):
        model = tf.Qwen2_5_VLForConditionalGeneration(cfg).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="4GB")
    _write_json(out / "config.json", raw)     # the flat form, whatever the installed transformers writes
    image = {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
             "min_pixels": 3136, "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
             "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711], "do_resize": True, "do_rescale": True,
             "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255}
    _write_json(out / "preprocessor_config.json", image)
    _write_json(out / "video_preprocessor_config.json", {**image, "video_processor_type": "Qwen2VLVideoProcessor"})
    _tokenizer_files(out, raw["max_position_embeddings"], "Qwen2_5_VLProcessor")


def write_demo_vlm(dir: str | Path, arch: str = "idefics3", size: str = "tiny") -> Path:
    """Write a random-weight VLM into `dir` (left alone when it already holds one); return its path."""
    if arch not in ARCHS:
        raise UserError(f"--vlm {arch!r} is unknown (one of {', '.join(ARCHS)})")
    if size not in SIZES:
        raise UserError(f"--size {size!r} is unknown (one of {', '.join(SIZES)})")
    out = Path(dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"model path {out} exists and is not a directory")
    done = out / ".autotune-vlm"
    if done.is_file():
        if done.read_text().strip() != f"{arch} {size}":
            raise UserError(f"{out} already holds another model ({done.read_text().strip()}); use another directory")
        return out
    out.mkdir(parents=True, exist_ok=True)
    (_idefics3 if arch == "idefics3" else _qwen2_5_vl)(out, size)
    done.write_text(f"{arch} {size}\n")       # last: an interrupted write is redone, never taken as complete
    return out
