"""`--lengths-only`: every text replaced by synthetic text of the same token length, keeping which
requests share a prefix, so that private prompts need never reach the tuning host.

Each request becomes a sequence of units (its tokens; for chat, a separator carrying the role before
each message's tokens). A request that shares its first L units with an earlier one gets that request's
synthetic first L units, then fresh random words; so a shared system prompt stays shared, a later turn
still extends the earlier turn, and nothing of the text survives but lengths and that sharing. The
words are single tokens of the model's own vocabulary (a space and letters, checked to encode to one
token), so the synthetic text has exactly the original token count; without a tokenizer they are common
English words, about one token each.
"""

from __future__ import annotations

import re
from typing import Hashable

import numpy as np

from autotune.bench.tokens import Tokenizer
from autotune.bench.trace.format import TraceRecord
from autotune.bench.trace.prefix import PrefixIndex
from autotune.bench.workloads._base import _WORDS
from autotune.errors import UserError


def single_token_words(tokenizer: Tokenizer | None) -> list[str]:
    """Vocabulary entries that are a space and a word and encode back to exactly themselves, one token."""
    if tokenizer is None:
        return [" " + w for w in _WORDS]
    words = []
    for i in range(tokenizer.vocab_size):
        text = tokenizer.decode([i])
        if re.fullmatch(r" [A-Za-z]{2,}", text) and tokenizer.encode(text) == [i]:
            words.append(text)
    if len(words) < 16:
        raise UserError("--lengths-only: the tokenizer has too few whole-word tokens to make synthetic text")
    return words


def _units(r: TraceRecord, tokenizer: Tokenizer | None) -> list[Hashable]:
    def toks(text: str) -> list[Hashable]:
        return list(tokenizer.encode(text)) if tokenizer is not None else list(text.split())

    if r.messages is not None:
        out: list[Hashable] = []
        for m in r.messages:
            out.append(("\x00role", m["role"]))
            out += toks(m["content"])
        return out
    return toks(r.prompt or "")


def lengths_only(records: list[TraceRecord], tokenizer: Tokenizer | None, seed: int) -> list[TraceRecord]:
    """The same records with synthetic text (in place); records without text are left as they are."""
    words = single_token_words(tokenizer)
    rng = np.random.default_rng(seed)
    index = PrefixIndex()
    made: list[list[Hashable]] = []
    for r in records:
        if r.prompt is None and r.messages is None:
            index.add([])
            made.append([])
            continue
        units = _units(r, tokenizer)
        j, n = index.add(units)
        synthetic = list(made[j][:n]) if j is not None else []
        fresh = rng.integers(0, len(words), len(units))
        for k in range(len(synthetic), len(units)):
            synthetic.append(units[k] if isinstance(units[k], tuple) else words[int(fresh[k])])
        made.append(synthetic)
        _rebuild(r, synthetic)
    return records


def _rebuild(r: TraceRecord, synthetic: list[Hashable]) -> None:
    if r.messages is None:
        r.prompt = "".join(str(u) for u in synthetic)
        return
    messages: list[dict[str, str]] = []
    for u in synthetic:
        if isinstance(u, tuple):
            messages.append({"role": str(u[1]), "content": ""})
        else:
            messages[-1]["content"] += str(u)
    r.messages = messages
