"""A shared prefix and unique suffixes: the traffic that prefix caching is for (system prompts, few-shot
headers, RAG templates)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from autotune.bench.tokens import Tokenizer
from autotune.bench.workloads._base import Prompt, Workload, positive_int, random_text


class PrefixWorkload(Workload):
    """`prefix:prefix_len=K,suffix_len=S,output_len=O`: every prompt starts with the same K tokens (drawn
    once per seed) and ends with its own S tokens, so a cache hit saves exactly the prefix."""

    kind = "prefix"
    keys = ("prefix_len", "suffix_len", "output_len")

    def __init__(self, prefix_len: int, suffix_len: int, output_len: int) -> None:
        self.prefix_len = positive_int(self.kind, "prefix_len", prefix_len)
        self.suffix_len = positive_int(self.kind, "suffix_len", suffix_len)
        self.output_len = positive_int(self.kind, "output_len", output_len)

    def params(self) -> dict[str, Any]:
        return {"kind": self.kind, "prefix_len": self.prefix_len, "suffix_len": self.suffix_len,
                "output_len": self.output_len}

    def iter_prompts(self, seed: int, tokenizer: Tokenizer | None) -> Iterator[Prompt]:
        rng = np.random.default_rng(seed)
        prefix, n_prefix = random_text(rng, self.prefix_len, tokenizer)
        while True:
            # the newline between prefix and suffix is a token of its own in most vocabularies
            suffix, _ = random_text(rng, max(1, self.suffix_len - 1), tokenizer)
            text = prefix + "\n" + suffix
            counted = None if tokenizer is None else len(tokenizer.encode(text))
            yield Prompt(text, self.output_len, counted)
