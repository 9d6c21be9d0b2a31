"""The vision side of a vision-language model: how many tokens an image becomes, and what the encoder
that makes them costs (parameters, FLOPs, the memory of vLLM's profiling run).

An image's tokens live in the KV cache like text and go through the language model's prefill like text
(seed 003: one image of 576 patches is 576 tokens of context); before that, the vision encoder runs over
its patches. Two families are modelled, with the processors' own resize rules, so that a count here is
the count the server reports:

- `qwen2_vl` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V): dynamic resolution. The image is resized to
  multiples of patch x merge pixels with its area kept within [min_pixels, max_pixels]
  (transformers' `smart_resize`); every merge x merge patches make one token; the prompt adds a
  vision-start and a vision-end token.
- `idefics3` (Idefics3, SmolVLM): tiles. The image is scaled so that its longest edge is
  `size.longest_edge`, cut into tiles of the encoder's input size, plus one global view; each tile gives
  (tile / patch)^2 / scale^2 tokens, and the prompt adds two tokens around each tile, a newline per row
  of tiles and four around the global view.

Read from the model directory: config.json's `vision_config`, and the processor's settings from
preprocessor_config.json (or processor_config.json's `image_processor`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from autotune.errors import UserError

FAMILIES = ("qwen2_vl", "idefics3")
_QWEN_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "glm4v_moe")
_IDEFICS_TYPES = ("idefics3", "smolvlm")
_MAX_IMAGE_SIDE = 4096          # Idefics3's cap on a resized image's longest edge


@dataclass(frozen=True)
class VisionProfile:
    family: str
    patch_size: int
    merge_size: int                 # qwen2_vl: spatial merge; idefics3: pixel-shuffle scale factor
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int            # the language model's hidden size (what the projector emits)
    temporal_patch_size: int = 1
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    window_size: int = 0            # qwen2.5-vl: windowed attention (pixels); 0: every layer attends to all patches
    full_attention_layers: int = 0  # layers that attend to the whole image anyway
    tile: int = 0                   # idefics3: the encoder's input size (pixels)
    longest_edge: int = 0           # idefics3: the longest edge images are scaled to before tiling
    splitting: bool = True          # idefics3: do_image_splitting

    # ---- tokens ---------------------------------------------------------------------------------
    def resized(self, width: int, height: int, max_pixels: int | None = None) -> tuple[int, int]:
        """qwen2_vl: the (width, height) the processor resizes an image to (transformers' smart_resize)."""
        factor = self.patch_size * self.merge_size
        lo, hi = self.min_pixels, max_pixels or self.max_pixels
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > hi:
            beta = math.sqrt(height * width / hi)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < lo:
            beta = math.sqrt(lo / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return w_bar, h_bar

    def grid(self, width: int, height: int, longest_edge: int | None = None) -> tuple[int, int]:
        """idefics3: (rows, cols) of tiles (0, 0 when the image is one global view only)."""
        edge = longest_edge or self.longest_edge
        if not self.splitting:
            return 0, 0
        h, w = height, width
        if w >= h:
            w, h = edge, int(edge / (width / height))
            h += h % 2
        else:
            h, w = edge, int(edge * (width / height))
            w += w % 2
        h, w = max(h, 1), max(w, 1)
        if max(h, w) > _MAX_IMAGE_SIDE:
            if w >= h:
                w, h = _MAX_IMAGE_SIDE, int(_MAX_IMAGE_SIDE / (w / h))
            else:
                h, w = _MAX_IMAGE_SIDE, int(_MAX_IMAGE_SIDE * (w / h))
        rows_px = math.ceil(h / self.tile) * self.tile
        cols_px = math.ceil(w / self.tile) * self.tile
        if rows_px > self.tile or cols_px > self.tile:
            return math.ceil(rows_px / self.tile), math.ceil(cols_px / self.tile)
        return 0, 0

    @property
    def tile_tokens(self) -> int:
        """idefics3: tokens per tile (the processor's image_seq_len)."""
        return (self.tile // self.patch_size) ** 2 // self.merge_size ** 2

    def placeholders(self, width: int, height: int, kwargs: Mapping[str, Any] | None = None) -> int:
        """The image's embedding tokens (what the encoder makes and the KV cache holds)."""
        if self.family == "qwen2_vl":
            w, h = self.resized(width, height, _max_pixels(kwargs))
            return (w // self.patch_size) * (h // self.patch_size) // self.merge_size ** 2
        rows, cols = self.grid(width, height, _longest_edge(kwargs))
        return max(rows * cols + (1 if rows * cols else 0), 1) * self.tile_tokens

    def tokens(self, width: int, height: int, kwargs: Mapping[str, Any] | None = None) -> int:
        """Prompt tokens the image adds: its placeholders and the special tokens around them."""
        n = self.placeholders(width, height, kwargs)
        if self.family == "qwen2_vl":
            return n + 2
        rows, cols = self.grid(width, height, _longest_edge(kwargs))
        return n + 2 * rows * cols + rows + (1 if rows * cols else 0) + 3

    def patches(self, width: int, height: int, kwargs: Mapping[str, Any] | None = None) -> int:
        """The encoder's sequence length for the image (before merging)."""
        if self.family == "qwen2_vl":
            return self.placeholders(width, height, kwargs) * self.merge_size ** 2
        rows, cols = self.grid(width, height, _longest_edge(kwargs))
        return max(rows * cols + (1 if rows * cols else 0), 1) * (self.tile // self.patch_size) ** 2

    def max_tokens_per_item(self, kwargs: Mapping[str, Any] | None = None,
                            size: tuple[int, int] | None = None) -> int:
        """vLLM's max_tokens_per_mm_item: the placeholders of the largest image the processor makes (or of
        the size a --limit-mm-per-prompt entry names)."""
        if size is not None:
            return self.placeholders(size[0], size[1], kwargs)
        if self.family == "qwen2_vl":   # vLLM: max_pixels // (patch x merge)^2, shaped within aspect ratio 200
            unit = self.patch_size * self.merge_size
            for n in range((_max_pixels(kwargs) or self.max_pixels) // unit ** 2, 0, -1):
                d = next(d for d in range(math.isqrt(n), 0, -1) if n % d == 0)
                if n // d / d <= 200:
                    return self.placeholders(unit * (n // d), unit * d, kwargs)
            return 1
        edge = _longest_edge(kwargs) or self.longest_edge
        return self.placeholders(edge, edge, kwargs)

    # ---- cost -------------------------------------------------------------------------------------
    @property
    def params(self) -> float:
        """Encoder and projector parameters."""
        h, i = self.hidden_size, self.intermediate_size
        pixels = 3 * self.temporal_patch_size * self.patch_size ** 2
        block = 4 * h * h + 4 * h + (3 if self.family == "qwen2_vl" else 2) * h * i + 4 * h
        if self.family == "qwen2_vl":
            merged = h * self.merge_size ** 2
            projector = merged * merged + merged * self.out_hidden_size
            embed = pixels * h
        else:
            projector = h * self.merge_size ** 2 * self.out_hidden_size
            embed = pixels * h + (self.tile // self.patch_size) ** 2 * h
        return float(embed + self.depth * block + projector)

    def flops(self, patches: float, image_patches: float | None = None) -> float:
        """FLOPs to encode `patches` patches (one image of `image_patches`, or several adding up to it):
        2 x parameters per patch, plus attention over each patch's context (a window, the whole image in
        full-attention layers, a tile for idefics3)."""
        per = image_patches or patches
        if self.family == "qwen2_vl" and self.window_size:
            window = min(per, (self.window_size // self.patch_size) ** 2)
            ctx = ((self.depth - self.full_attention_layers) * window + self.full_attention_layers * per)
        elif self.family == "qwen2_vl":
            ctx = self.depth * per
        else:
            ctx = self.depth * (self.tile // self.patch_size) ** 2
        return 2 * self.params * patches + 4 * self.hidden_size * patches * ctx

    def activation_bytes(self, patches: float) -> float:
        """Peak memory of one encoder forward pass over `patches` patches: a block's live tensors (residual,
        normed input, MLP inputs and outputs) in 16-bit, plus the pixels in float32."""
        per_patch = 2 * (3 * self.hidden_size + 3 * self.intermediate_size) \
            + 4 * 3 * self.temporal_patch_size * self.patch_size ** 2
        return patches * per_patch

    def describe(self) -> str:
        return (f"vision {self.family}: {self.params / 1e9:.2f}B params, patch {self.patch_size}, merge "
                f"{self.merge_size}, at most {self.max_tokens_per_item()} tokens per image")


def _max_pixels(kwargs: Mapping[str, Any] | None) -> int | None:
    if not kwargs:
        return None
    v = kwargs.get("max_pixels")
    if v is None and isinstance(kwargs.get("size"), Mapping):
        v = kwargs["size"].get("longest_edge") if "shortest_edge" in kwargs["size"] else None
    return int(v) if isinstance(v, (int, float)) and v > 0 else None


def _longest_edge(kwargs: Mapping[str, Any] | None) -> int | None:
    size = (kwargs or {}).get("size")
    v = size.get("longest_edge") if isinstance(size, Mapping) else None
    return int(v) if isinstance(v, (int, float)) and v > 0 else None


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def processor_settings(model_dir: Path) -> dict[str, Any]:
    """The image processor's settings saved beside the model (preprocessor_config.json, or the
    `image_processor` entry of processor_config.json)."""
    pre = _read(model_dir / "preprocessor_config.json")
    if pre:
        return pre
    proc = _read(model_dir / "processor_config.json")
    image = proc.get("image_processor")
    return {**image, "image_seq_len": proc.get("image_seq_len")} if isinstance(image, dict) else {}


def vision_from_config(cfg: Mapping[str, Any], processor: Mapping[str, Any], where: str) -> VisionProfile | None:
    """The vision profile of a model's config.json (None for a text-only model or a family not modelled)."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, Mapping):
        return None
    kind = str(cfg.get("model_type", ""))
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
    lm_hidden = int(text.get("hidden_size") or 0)
    try:
        if kind in _QWEN_TYPES:
            return _qwen(vc, processor, lm_hidden)
        if kind in _IDEFICS_TYPES:
            return _idefics(vc, processor, lm_hidden, int(cfg.get("scale_factor") or 2))
    except (TypeError, ValueError, KeyError) as e:
        raise UserError(f"{where}: vision_config is not usable ({e})") from None
    return None


def _qwen(vc: Mapping[str, Any], proc: Mapping[str, Any], lm_hidden: int) -> VisionProfile:
    # Qwen2-VL names the encoder width embed_dim (hidden_size is the LM's) and its MLP mlp_ratio
    width = int(vc.get("embed_dim") or vc["hidden_size"])
    inter = int(vc.get("intermediate_size") or width * float(vc.get("mlp_ratio", 4)))
    size = proc.get("size") if isinstance(proc.get("size"), Mapping) else {}
    full = vc.get("fullatt_block_indexes")
    return VisionProfile(
        family="qwen2_vl", patch_size=int(proc.get("patch_size") or vc.get("patch_size") or 14),
        merge_size=int(proc.get("merge_size") or vc.get("spatial_merge_size") or 2),
        depth=int(vc.get("depth") or vc.get("num_hidden_layers")), hidden_size=width, intermediate_size=inter,
        num_heads=int(vc.get("num_heads") or vc.get("num_attention_heads") or 16),
        out_hidden_size=int(vc.get("out_hidden_size") or lm_hidden or width),
        temporal_patch_size=int(proc.get("temporal_patch_size") or vc.get("temporal_patch_size") or 2),
        min_pixels=int(proc.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
        max_pixels=int(proc.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
        window_size=int(vc.get("window_size") or 0) if full is not None else 0,
        full_attention_layers=len(full) if isinstance(full, list) else 0)


def _idefics(vc: Mapping[str, Any], proc: Mapping[str, Any], lm_hidden: int, scale: int) -> VisionProfile:
    tile = int((proc.get("max_image_size") or {}).get("longest_edge") or vc.get("image_size") or 364)
    return VisionProfile(
        family="idefics3", patch_size=int(vc.get("patch_size") or 14), merge_size=scale,
        depth=int(vc.get("num_hidden_layers") or 12), hidden_size=int(vc.get("hidden_size") or 1152),
        intermediate_size=int(vc.get("intermediate_size") or 3072),
        num_heads=int(vc.get("num_attention_heads") or 16), out_hidden_size=lm_hidden,
        tile=tile, longest_edge=int((proc.get("size") or {}).get("longest_edge") or 4 * tile),
        splitting=bool(proc.get("do_image_splitting", True)))


def load_vision(model_dir: str | Path) -> VisionProfile | None:
    """The vision profile of a local model directory; None when it is not a VLM modelled here."""
    d = Path(model_dir).expanduser()
    if d.is_file():
        d = d.parent
    cfg = _read(d / "config.json")
    return vision_from_config(cfg, processor_settings(d), str(d / "config.json")) if cfg else None


def with_kwargs(v: VisionProfile, kwargs: Mapping[str, Any] | None) -> VisionProfile:
    """The profile as a server started with `--mm-processor-kwargs` sees it."""
    if not kwargs:
        return v
    changes: dict[str, Any] = {}
    if _max_pixels(kwargs):
        changes["max_pixels"] = _max_pixels(kwargs)
    if isinstance(kwargs.get("min_pixels"), (int, float)):
        changes["min_pixels"] = int(kwargs["min_pixels"])
    if _longest_edge(kwargs) and v.family == "idefics3":
        changes["longest_edge"] = _longest_edge(kwargs)
    return replace(v, **changes)
