"""Small readers shared by the log formats: timestamps, message text, token counts."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from autotune.bench.tokens import Tokenizer
from autotune.errors import UserError

CHARS_PER_TOKEN = 4   # only without a tokenizer and without the server's usage counts: the BPE average


def parse_time(value: Any, where: str) -> float:
    """Seconds since the epoch from a number (seconds; milliseconds when it is too large to be seconds)
    or an ISO 8601 string (`2025-01-01T10:00:00.5Z`; no zone means UTC)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value) / 1000.0 if value > 1e11 else float(value)
    if isinstance(value, str) and value.strip():
        text = value.strip()
        try:
            return parse_time(float(text), where)
        except ValueError:
            pass
        try:
            stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UserError(f"{where}: timestamp {text[:40]!r} is neither seconds nor ISO 8601") from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.timezone.utc)
        return stamp.timestamp()
    raise UserError(f"{where}: no timestamp")


def content_text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of an OpenAI content list (images are dropped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts)
    return None


def content_images(content: Any) -> list[str | None]:
    """The images of an OpenAI content list, in order: each part's URL (a data URI, or a link), None where
    the part holds none (`image_url` parts of chat completions, `input_image` parts of the Responses API)."""
    if not isinstance(content, list):
        return []
    out: list[str | None] = []
    for p in content:
        if not isinstance(p, dict) or p.get("type") not in ("image_url", "input_image", "image"):
            continue
        url = p.get("image_url", p.get("url"))
        if isinstance(url, dict):
            url = url.get("url")
        out.append(url if isinstance(url, str) else None)
    return out


def logged_image(url: str | None, message: int, keep: bool = True) -> dict[str, Any]:
    """A trace image from a logged URL: its size and format from the bytes of a data URI (a link is not
    fetched: its size stays unknown); the URI itself kept when `keep`."""
    from autotune.bench.images import uri_size
    from autotune.bench.trace.format import image_record

    size = uri_size(url) if url else None
    if size is None:
        return image_record(None, None, None, message)
    return image_record(size[0], size[1], size[2], message, url if keep else None)


class TokenCounter:
    """The model's tokenizer when given; else about four characters a token, said in the trace header.

    Encodings are cached by text: in a multi-turn log every turn repeats the whole conversation so far,
    and encoding each message once instead of once per later turn is most of a conversion's time."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.approximate = False
        self._ids: dict[str, tuple[int, ...]] = {}
        self._words: dict[str, int] = {}

    def ids(self, text: str) -> tuple[int, ...]:
        """The text's token ids; without a tokenizer, its whitespace-separated words as interned ids."""
        out = self._ids.get(text)
        if out is None:
            if self.tokenizer is not None:
                out = tuple(self.tokenizer.encode(text))
            else:
                out = tuple(self._words.setdefault(w, len(self._words)) for w in text.split())
            self._ids[text] = out
        return out

    def count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.ids(text))
        self.approximate = True
        return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        """The messages' text only: the server's chat template adds a few tokens per message."""
        return sum(self.count(m["content"]) for m in messages)
