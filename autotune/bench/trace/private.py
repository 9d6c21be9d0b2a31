"""`--lengths-only`: every text replaced by synthetic text of the same token length, keeping which
requests share a prefix, so that private prompts need never reach the tuning host.

Each request becomes a sequence of units (its tokens; for chat, a separator carrying the role before
each message's tokens). A request that shares its first L units with an earlier one gets that request's
synthetic first L units, then fresh random words; so a shared system prompt stays shared, a later turn
still extends the earlier turn, and nothing of the text survives but lengths and that sharing. The
words are single tokens of the model's own vocabulary (a space and letters, checked to encode to one
token), so the synthetic text has exactly the original token count; without a tokenizer they are common
English words, about one token each. Images keep their count, size, format and message, never their
bytes: the replay makes a synthetic image of each recorded size.
"""

from __future__ import annotations

import re
import numpy as np

from autotune.bench.tokens import Tokenizer
from autotune.bench.trace.fields import TokenCounter
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


def _units(r: TraceRecord, counter: TokenCounter, roles: dict[str, int]) -> list[int]:
    """Token ids, and before each chat message a separator that names its role (a negative id)."""
    if r.messages is None:
        return list(counter.ids(r.prompt or ""))
    out: list[int] = []
    for m in r.messages:
        out.append(-1 - roles.setdefault(m["role"], len(roles)))
        out += counter.ids(m["content"])
    return out


def lengths_only(records: list[TraceRecord], tokenizer: Tokenizer | None, seed: int) -> list[TraceRecord]:
    """The same records with synthetic text (in place); records without text are left as they are."""
    words = single_token_words(tokenizer)
    rng = np.random.default_rng(seed)
    index = PrefixIndex()
    counter = TokenCounter(tokenizer)
    roles: dict[str, int] = {}
    made: list[list[int]] = []                 # per record: separators (< 0) and synthetic word indices
    for r in records:
        if r.images:
            r.images = [{k: v for k, v in img.items() if k != "url"} for img in r.images]
        if r.prompt is None and r.messages is None:
            index.add([])
            made.append([])
            continue
        units = _units(r, counter, roles)
        j, n = index.add(units)
        synthetic = made[j][:n] if j is not None else []
        fresh = rng.integers(0, len(words), len(units))
        synthetic += [u if u < 0 else int(fresh[k]) for k, u in enumerate(units[len(synthetic):], len(synthetic))]
        made.append(synthetic)
        _rebuild(r, synthetic, words, {v: k for k, v in roles.items()})
    return records


def _rebuild(r: TraceRecord, synthetic: list[int], words: list[str], role_of: dict[int, str]) -> None:
    if r.messages is None:
        r.prompt = "".join(words[u] for u in synthetic)
        return
    messages: list[dict[str, str]] = []
    parts: list[str] = []
    for u in synthetic:
        if u < 0:
            if messages:
                messages[-1]["content"] = "".join(parts)
            messages.append({"role": role_of[-1 - u], "content": ""})
            parts = []
        else:
            parts.append(words[u])
    messages[-1]["content"] = "".join(parts)
    r.messages = messages
