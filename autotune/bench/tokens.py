"""The model's tokenizer, when it is on local disk.

Prompts of an exact token length need the model's own tokenizer; the tuner never downloads one (no hub
access, and a tokenizer that differs from the server's would miscount). Without it, workloads make
approximate prompts and the server's `usage` fields give the true counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from autotune.errors import UserError


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class _FastTokenizer:
    """`tokenizers.Tokenizer` from a tokenizer.json: loads in milliseconds, unlike transformers."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _Tok

        self._tok = _Tok.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=False)
        added = self._tok.get_added_tokens_decoder() if hasattr(self._tok, "get_added_tokens_decoder") else {}
        self.special_ids = {int(i) for i, t in added.items() if getattr(t, "special", True)}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(tokenizer: str | None, model: str | None = None) -> Tokenizer | None:
    """The tokenizer named by `tokenizer` (a directory or a tokenizer.json), else the model's own when the
    model is a local directory; None when neither is on disk. An explicit path that cannot be read is a
    user error; an absent one for the model is not (the server's usage fields take over)."""
    if tokenizer:
        path = _tokenizer_file(Path(tokenizer))
        if path is None:
            raise UserError(f"no tokenizer.json at {tokenizer!r}: give a model directory or a tokenizer.json file")
        return _FastTokenizer(path)
    if model:
        path = _tokenizer_file(Path(model))
        if path is not None:
            return _FastTokenizer(path)
    return None


def _tokenizer_file(p: Path) -> Path | None:
    try:
        if p.is_file() and p.name.endswith(".json"):
            return p
        if p.is_dir() and (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
    except OSError:
        return None
    return None
