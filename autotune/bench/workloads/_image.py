"""Chat requests that carry images, mixed with text-only ones: the traffic of a vision-language model.

A share of the requests carries one or more images of the given sizes; every request has a text part of
random tokens (the random workload's lengths). Images are made per request from the seed (bench/images.py),
so no two requests send the same image: the server's processor and prefix caches key images by their
bytes, and a repeated image would measure a cache hit, not the encoder.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np

from autotune.bench.images import FORMATS, made_image, parse_size
from autotune.bench.tokens import Tokenizer
from autotune.bench.workloads._base import Prompt, Workload, random_text
from autotune.bench.workloads._random import RandomWorkload
from autotune.errors import UserError


def _sizes(value: Any) -> tuple[tuple[int, int], ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split("/")
    out = tuple(parse_size(str(x), "workload image: sizes") for x in items if str(x).strip())
    if not out:
        raise UserError("workload image: sizes needs at least one WIDTHxHEIGHT")
    return out


def _count_range(value: Any) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(value))
    if not m:
        raise UserError(f"workload image: images={value!r} is not N or LOW-HIGH (e.g. 1-2)")
    lo, hi = int(m[1]), int(m[2] or m[1])
    if lo < 1 or hi < lo:
        raise UserError(f"workload image: images={value!r} must be >= 1, and LOW <= HIGH")
    return lo, hi


class ImageWorkload(Workload):
    """`image:input_len=N,output_len=N[,share=S][,images=K|LOW-HIGH][,sizes=WxH/WxH...][,format=png|jpeg]
    [,range_ratio=R]`: a share S (default 1) of the requests carries K images (or a uniform count in
    LOW..HIGH), each of a size drawn from `sizes` (default 512x512); the others are text only. Both kinds
    have text of `input_len` tokens and ask for `output_len` tokens. Sent to the chat endpoint.

    >>> w = ImageWorkload(64, 16, share=0.5, images="1-2", sizes="448x448/1024x768")
    >>> sum(1 for p in w.prompts(40) if p.images) > 0
    True
    """

    kind = "image"
    keys = ("input_len", "output_len", "share", "images", "sizes", "format", "range_ratio")

    def __init__(self, input_len: int, output_len: int, share: float = 1.0, images: Any = 1,
                 sizes: Any = "512x512", format: str = "png", range_ratio: float = 0.0) -> None:
        self.text = RandomWorkload(input_len, output_len, range_ratio)   # the lengths' validation and draws
        try:
            self.share = float(share)
        except (TypeError, ValueError):
            raise UserError(f"workload image: share={share!r} is not a number") from None
        if not 0.0 <= self.share <= 1.0:
            raise UserError(f"workload image: share must be in [0, 1], got {self.share}")
        self.count = _count_range(images)
        self.sizes = _sizes(sizes)
        if format not in FORMATS:
            raise UserError(f"workload image: format={format!r} is unknown (one of {', '.join(FORMATS)})")
        self.format = format

    @property
    def input_len(self) -> int:
        return self.text.input_len

    @property
    def output_len(self) -> int:
        return self.text.output_len

    @property
    def max_images(self) -> int:
        return self.count[1] if self.share > 0 else 0

    @property
    def image_sizes(self) -> tuple[tuple[int, int], ...]:
        return self.sizes if self.share > 0 else ()

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "input_len": self.input_len, "output_len": self.output_len,
                               "share": self.share,
                               "images": str(self.count[0]) if self.count[0] == self.count[1] else
                               f"{self.count[0]}-{self.count[1]}",
                               "sizes": "/".join(f"{w}x{h}" for w, h in self.sizes), "format": self.format}
        if self.text.range_ratio:
            out["range_ratio"] = self.text.range_ratio
        return out

    def iter_prompts(self, seed: int, tokenizer: Tokenizer | None) -> Iterator[Prompt]:
        rng = np.random.default_rng(seed)
        while True:
            n_in, n_out = self.text._draw(rng, self.input_len), self.text._draw(rng, self.output_len)
            text, counted = random_text(rng, n_in, tokenizer)
            images = ()
            if rng.random() < self.share:
                k = int(rng.integers(self.count[0], self.count[1] + 1))
                images = tuple(made_image(*self.sizes[int(rng.integers(len(self.sizes)))],
                                          seed=int(rng.integers(2**62)), fmt=self.format) for _ in range(k))
            yield Prompt(text, n_out, counted, images=images)
