"""ShareGPT conversations (`conversations`/`conversation`: `{"from": "human"|"gpt"|"system", "value"}`,
one JSON object a line or one JSON array) as multi-turn traffic. The format has no times, so
conversations start as a seeded Poisson process at `rate` per second and each turn follows the previous
answer after `think_s` seconds; every human turn with a reply becomes one request carrying the whole
conversation so far, the reply's length its output length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autotune.bench.trace.conversations import Timed
from autotune.bench.trace.fields import TokenCounter, content_text
from autotune.bench.trace.format import TraceRecord
from autotune.bench.workloads._jsonl import read_json_items
from autotune.errors import UserError

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


def read_sharegpt(path: Path, counter: TokenCounter, *, rate: float, think_s: float, seed: int) -> list[Timed]:
    items = read_json_items(path, "ShareGPT")
    rng = np.random.default_rng(seed)
    start = 0.0
    out: list[Timed] = []
    for n, item in enumerate(items):
        turns = _turns(item)
        if not turns:
            continue
        conv = f"c{n}"
        history: list[dict[str, str]] = []
        k = 0
        for i, (role, text) in enumerate(turns):
            if role == "user" and i + 1 < len(turns) and turns[i + 1][0] == "assistant" and text.strip():
                msgs = history + [{"role": "user", "content": text}]
                rec = TraceRecord(t=start + k * think_s + 1e-6 * k, output_tokens=max(1, counter.count(turns[i + 1][1])),
                                  input_tokens=counter.count_messages(msgs) or None, messages=msgs,
                                  conversation=conv, turn=k, think_s=think_s if k else None)
                out.append(Timed(rec))
                k += 1
            history = history + [{"role": role, "content": text}]
        start += float(rng.exponential(1.0 / rate))
    if not out:
        raise UserError(f"{path.name}: no conversation with a human turn and a reply")
    return out


def _turns(item: Any) -> list[tuple[str, str]]:
    if not isinstance(item, dict):
        return []
    turns = item.get("conversations", item.get("conversation"))
    if not isinstance(turns, list):
        return []
    out = []
    for t in turns:
        if not isinstance(t, dict):
            continue
        role = _ROLES.get(str(t.get("from", t.get("role", ""))).lower())
        text = content_text(t.get("value", t.get("content")))
        if role and text is not None:
            out.append((role, text))
    return out
