"""The multimodal knobs (search_spaces/multimodal.yaml) joined to a study's space when its model is a
vision-language model, and what their known constraints need to know: the largest image's tokens
under a candidate's processor arguments, and the most images the workload puts in one request.

A separate file rather than lines of default.yaml and cpu.yaml: those spaces serve every model, and
these flags mean something only to a VLM (a text model's vLLM rejects none of them, but tuning them
there would spend trials on no-ops).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autotune.perfmodel.vision import VisionProfile
from autotune.space.space import SPACES_DIR, SearchSpace

# Params that only one family's processor takes (others are dropped for other families).
_FAMILY_ONLY = {"mm_max_pixels": "qwen2_vl"}


@dataclass(frozen=True)
class MultimodalContext:
    """What the constraints need: the model's vision profile and the workload's most images per request."""

    vision: VisionProfile
    max_images: int

    def max_tokens_per_image(self, processor_kwargs: Any) -> int:
        kwargs = _json(processor_kwargs)
        return self.vision.max_tokens_per_item(kwargs)


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        out = json.loads(value) if isinstance(value, str) else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def image_limit_of(value: Any) -> int | None:
    """The image count of a --limit-mm-per-prompt value (`{"image": 2}` or `{"image": {"count": 2}}`)."""
    entry = _json(value).get("image")
    if isinstance(entry, dict):
        entry = entry.get("count")
    return int(entry) if isinstance(entry, (int, float)) and not isinstance(entry, bool) else None


def with_multimodal(space: SearchSpace, vision: VisionProfile) -> SearchSpace:
    """`space` plus the multimodal knobs that apply to `vision`'s family; unchanged when the space already
    tunes any of them (the study chose its own)."""
    extra = SearchSpace.load(str(SPACES_DIR / "multimodal.yaml"))
    if any(name in space.params for name in extra.params):
        return space
    params = dict(space.params)
    for name, p in extra.params.items():
        if _FAMILY_ONLY.get(name, vision.family) == vision.family:
            params[name] = p
    return SearchSpace(params, list(space.fixed_flags), f"{space.source} + multimodal.yaml", space.model_max_len,
                       raw_params={**extra.raw_params, **space.raw_params}, multimodal=space.multimodal)
