"""Prompts from a file: ShareGPT conversations, or plain `{"prompt": ..., "output_len": ...}` lines.

Real traffic has a spread of lengths that random prompts lack; a recorded dataset brings it. The file is
read once and replayed shuffled by seed, cycling when a run needs more requests than it holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from autotune.bench.tokens import Tokenizer
from autotune.bench.workloads._base import Prompt, Workload, positive_int
from autotune.errors import UserError

_CHARS_PER_TOKEN = 4  # only when no tokenizer is at hand: the usual English average for BPE vocabularies


class JsonlWorkload(Workload):
    """`jsonl:path=FILE[,output_len=N]`. Each line is a ShareGPT record (`conversations` or
    `conversation`: a list of `{"from": "human"|"gpt", "value": ...}`; the first human turn is the
    prompt and the reply's length the output length) or `{"prompt": ..., "output_len": ...}`. A ShareGPT
    `.json` array works too. `output_len` overrides every record's."""

    kind = "jsonl"
    keys = ("path", "output_len")

    def __init__(self, path: str, output_len: int | None = None) -> None:
        self.path = str(path)
        self.output_len = None if output_len is None else positive_int(self.kind, "output_len", output_len)
        self._records = _read_records(Path(self.path))

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": self.path}
        if self.output_len is not None:
            out["output_len"] = self.output_len
        return out

    def iter_prompts(self, seed: int, tokenizer: Tokenizer | None) -> Iterator[Prompt]:
        rng = np.random.default_rng(seed)
        prompts = [self._prompt(text, reply, out, tokenizer) for text, reply, out in self._records]
        while True:
            for i in rng.permutation(len(prompts)):
                yield prompts[int(i)]

    def _prompt(self, text: str, reply: str | None, out: int | None, tokenizer: Tokenizer | None) -> Prompt:
        if self.output_len is not None:
            out = self.output_len
        elif out is None:
            reply = reply or ""
            out = len(tokenizer.encode(reply)) if tokenizer else len(reply) // _CHARS_PER_TOKEN
        counted = len(tokenizer.encode(text)) if tokenizer else None
        return Prompt(text, max(1, int(out)), counted)


def read_json_items(path: Path, what: str) -> list[Any]:
    """The objects of a JSON-lines file, or of a file holding one JSON array (ShareGPT ships both)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what}: cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    try:
        return json.loads(raw) if raw.lstrip().startswith("[") else \
            [json.loads(line) for line in raw.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise UserError(f"{what}: {path} is not JSON lines (line {e.lineno}: {e.msg})") from None


def _read_records(path: Path) -> list[tuple[str, str | None, int | None]]:
    items = read_json_items(path, "workload jsonl")
    out = [r for r in (_record(item) for item in items) if r is not None]
    if not out:
        raise UserError(f"workload jsonl: {path} holds no usable prompt (ShareGPT conversations or "
                        f"{{\"prompt\": ..., \"output_len\": ...}} lines)")
    return out


def _record(item: Any) -> tuple[str, str | None, int | None] | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("prompt"), str):
        n = item.get("output_len")
        return item["prompt"], None, int(n) if isinstance(n, (int, float)) and n > 0 else 64
    turns = item.get("conversations", item.get("conversation"))
    if not isinstance(turns, list):
        return None
    texts = [t.get("value", t.get("content")) for t in turns if isinstance(t, dict)]
    texts = [t for t in texts if isinstance(t, str)]
    if len(texts) < 2 or not texts[0].strip():
        return None
    return texts[0], texts[1], None
