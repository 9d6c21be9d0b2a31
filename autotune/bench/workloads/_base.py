"""What every workload is: an endless, seeded stream of prompts with the output length each asks for.

Endless so that duration-bound runs never run dry; seeded so that two trials of one study offer the
same requests and their difference is the server's, not the dice's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import islice
from typing import Any, Iterator

import numpy as np

from autotune.bench.images import ImageRef
from autotune.bench.tokens import Tokenizer
from autotune.errors import UserError


@dataclass(frozen=True)
class Prompt:
    """One request's text. `input_tokens` is the tokenizer's count of the text when one was available,
    else None (the server's usage field then gives it). A replayed trace adds when the request arrived
    (`at_s`, seconds since the trace's start), its conversation and think time, and its chat messages
    (sent as such on the chat endpoint; `text` is then their contents, for the completions endpoint).
    `images` go with the request as `image_url` content parts (chat endpoint only)."""

    text: str
    output_len: int
    input_tokens: int | None = None
    at_s: float | None = None
    conversation: str | None = None
    think_s: float | None = None
    messages: tuple[dict[str, str], ...] | None = None
    images: tuple[ImageRef, ...] = ()


class Workload(ABC):
    """A kind of traffic. Subclasses name their `kind` and their keys; `params()` round-trips through
    `parse_workload`, so a study stores the mapping and gets the same workload back."""

    kind: str = ""
    keys: tuple[str, ...] = ()

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The mapping form (`{kind: random, input_len: 300, ...}`)."""

    @abstractmethod
    def iter_prompts(self, seed: int, tokenizer: Tokenizer | None) -> Iterator[Prompt]:
        """Prompts without end, the same sequence for the same seed and tokenizer."""

    def prompts(self, n: int, *, seed: int = 0, tokenizer: Tokenizer | None = None) -> list[Prompt]:
        return list(islice(self.iter_prompts(seed, tokenizer), n))

    @property
    def max_images(self) -> int:
        """Most images one request carries: what the server's --limit-mm-per-prompt must allow (0: text only)."""
        return 0

    @property
    def image_sizes(self) -> tuple[tuple[int, int], ...]:
        """The (width, height) of the images requests may carry, each once: what the memory model and the
        server's token budget must hold."""
        return ()

    # one_pass gives a sample, not the traffic itself: `show` must not print a synthetic workload's
    # profile as "100 requests" when a study sends thousands of them
    one_pass_is_sample = True

    def one_pass(self, tokenizer: Tokenizer | None, n: int = 100) -> list[Prompt]:
        """What describes the workload (bench/profile.py): a sample of `n` prompts; a trace gives itself."""
        return self.prompts(n, tokenizer=tokenizer)

    def __str__(self) -> str:
        p = self.params()
        return p["kind"] + ":" + ",".join(f"{k}={v}" for k, v in p.items() if k != "kind")


def positive_int(kind: str, key: str, value: Any, minimum: int = 1) -> int:
    try:
        out = int(value)
        if out != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise UserError(f"workload {kind}: {key}={value!r} is not an integer") from None
    if out < minimum:
        raise UserError(f"workload {kind}: {key} must be >= {minimum}, got {out}")
    return out


# Common English words: without a tokenizer, most BPE vocabularies give about one token each, so a
# prompt of N words is close to N tokens (the server's usage count is what gets recorded).
_WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but "
          "have an they you were her she there been one all we their has would when if so no will more "
          "can who said out up into do time only new some could these two may first then any like now "
          "my such make over our even most me state after also made many did must before back see through "
          "way where get much go well your know should down work year because come people just say each "
          "those take day good how long little use man great here both life being under never").split()


def random_text(rng: np.random.Generator, n_tokens: int, tokenizer: Tokenizer | None) -> tuple[str, int | None]:
    """Text of `n_tokens` tokens: random token ids decoded and re-encoded until the count holds (as
    `vllm bench serve`'s random dataset does), or random words when no tokenizer is at hand."""
    if n_tokens <= 0:
        return "", 0
    if tokenizer is None:
        return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), n_tokens)), None
    vocab = tokenizer.vocab_size
    special = getattr(tokenizer, "special_ids", set())
    ids = [int(i) for i in rng.integers(0, vocab, n_tokens) if int(i) not in special]
    text = tokenizer.decode(ids)
    for _ in range(10):
        enc = tokenizer.encode(text)
        if len(enc) == n_tokens:
            return text, n_tokens
        if len(enc) > n_tokens:
            enc = enc[:n_tokens]
        else:
            enc = enc + [int(i) for i in rng.integers(0, vocab, n_tokens - len(enc)) if int(i) not in special]
        text = tokenizer.decode(enc)
    text, count = _trim(text, n_tokens, tokenizer)
    for _ in range(4 * (n_tokens - count)):      # top up a short cut one random token at a time
        if count == n_tokens:
            break
        candidate = text + tokenizer.decode([int(rng.integers(0, vocab))])
        c = len(tokenizer.encode(candidate))
        if c <= n_tokens:
            text, count = candidate, c
    return text, count


def _trim(text: str, n_tokens: int, tokenizer: Tokenizer) -> tuple[str, int]:
    """Decoding and re-encoding can merge or split tokens at every try; cut the text at the longest
    character prefix that holds at most `n_tokens` (bisection: a few encodes), and report its count."""
    count = len(tokenizer.encode(text))
    if count <= n_tokens:
        return text, count
    lo, hi = 0, len(text)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(tokenizer.encode(text[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid
    return text[:lo], len(tokenizer.encode(text[:lo]))
