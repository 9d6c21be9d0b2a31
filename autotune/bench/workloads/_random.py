"""Random prompts of set lengths: the workload of `vllm bench serve --dataset-name random`."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from autotune.bench.tokens import Tokenizer
from autotune.bench.workloads._base import Prompt, Workload, positive_int, random_text
from autotune.errors import UserError


class RandomWorkload(Workload):
    """`random:input_len=300,output_len=40[,range_ratio=0.2]`: lengths drawn uniformly from
    [len*(1-r), len*(1+r)] per request, the way vLLM's random dataset draws them.

    >>> RandomWorkload(300, 40).prompts(2)[0].output_len
    40
    """

    kind = "random"
    keys = ("input_len", "output_len", "range_ratio")

    def __init__(self, input_len: int, output_len: int, range_ratio: float = 0.0) -> None:
        self.input_len = positive_int(self.kind, "input_len", input_len)
        self.output_len = positive_int(self.kind, "output_len", output_len)
        try:
            self.range_ratio = float(range_ratio)
        except (TypeError, ValueError):
            raise UserError(f"workload random: range_ratio={range_ratio!r} is not a number") from None
        if not 0.0 <= self.range_ratio < 1.0:
            raise UserError(f"workload random: range_ratio must be in [0, 1), got {self.range_ratio}")

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "input_len": self.input_len, "output_len": self.output_len}
        if self.range_ratio:
            out["range_ratio"] = self.range_ratio
        return out

    def _draw(self, rng: np.random.Generator, mean: int) -> int:
        if not self.range_ratio:
            return mean
        lo = max(1, int(mean * (1 - self.range_ratio)))
        hi = max(lo, int(mean * (1 + self.range_ratio)))
        return int(rng.integers(lo, hi + 1))

    def iter_prompts(self, seed: int, tokenizer: Tokenizer | None) -> Iterator[Prompt]:
        rng = np.random.default_rng(seed)
        while True:
            n_in, n_out = self._draw(rng, self.input_len), self._draw(rng, self.output_len)
            text, counted = random_text(rng, n_in, tokenizer)
            yield Prompt(text, n_out, counted)
