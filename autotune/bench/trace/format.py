"""The canonical trace: one JSON object per request, in arrival order, after an optional header line.

    {"autotune_trace": 1, "source": "openai", "lengths_only": true, "counted_with": "tokenizer.json"}
    {"t": 0.0, "output_tokens": 87, "input_tokens": 412, "messages": [{"role": "user", "content": "..."}]}
    {"t": 0.4, "output_tokens": 12, "input_tokens": 30, "prompt": "..."}
    {"t": 1.9, "output_tokens": 40, "input_tokens": 700}                       # lengths only: text made at replay
    {"t": 9.1, "output_tokens": 64, "input_tokens": 520, "messages": [...], "conversation": "c3", "turn": 1,
     "think_s": 4.2}
    {"t": 9.8, "output_tokens": 50, "messages": [...], "images": [{"width": 1024, "height": 768, "format": "jpeg",
     "message": 0}]}                                                             # an image: its size only

`images` are the request's images, each with its size, its format and the index of the message it was
part of; `url` keeps the image itself (a data URI) where the log held one and the conversion was not
lengths-only. An image without `url` is made at replay (seeded, of its size); a width and height of
null (an image logged by URL, which is never fetched) is replayed at UNKNOWN_SIZE.

`t` is seconds since the trace's first request; `output_tokens` is sent as `max_tokens` with EOS
ignored, so the recorded output-length distribution holds whatever the model says. A turn of a
conversation (`turn` > 0) is sent after the previous turn's answer plus `think_s` (when the log
recorded when that answer ended), else at its recorded time but never before that answer. Nothing else
of a source log is kept: user ids, metadata and answer texts stay behind.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from autotune.errors import UserError

FORMAT_VERSION = 1
HEADER_KEY = "autotune_trace"
UNKNOWN_SIZE = (512, 512)   # an image logged by URL: its size is unknown without fetching it
_IMAGE_KEYS = {"width", "height", "format", "message", "url"}


@dataclass
class TraceRecord:
    t: float
    output_tokens: int
    input_tokens: int | None = None
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    conversation: str | None = None
    turn: int = 0
    think_s: float | None = None
    images: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": round(self.t, 6), "output_tokens": self.output_tokens}
        for key in ("input_tokens", "prompt", "messages", "conversation"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.conversation is not None:
            out["turn"] = self.turn
        if self.think_s is not None:
            out["think_s"] = round(self.think_s, 6)
        if self.images:
            out["images"] = self.images
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "TraceRecord":
        if not isinstance(obj, dict):
            raise UserError(f"{where}: a trace record is a JSON object")
        t, out = obj.get("t"), obj.get("output_tokens")
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
            raise UserError(f"{where}: 't' (seconds since the trace's start) is missing or not a number")
        if not isinstance(out, int) or isinstance(out, bool) or out < 1:
            raise UserError(f"{where}: 'output_tokens' must be an integer >= 1")
        n_in = obj.get("input_tokens")
        if n_in is not None and (not isinstance(n_in, int) or n_in < 1):
            raise UserError(f"{where}: 'input_tokens' must be an integer >= 1")
        prompt, messages = obj.get("prompt"), obj.get("messages")
        if prompt is not None and not isinstance(prompt, str):
            raise UserError(f"{where}: 'prompt' must be a string")
        if messages is not None and not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                for m in messages)):
            raise UserError(f"{where}: 'messages' must be a list of {{role, content}} with string content")
        if prompt is None and messages is None and n_in is None:
            raise UserError(f"{where}: give 'prompt', 'messages' or 'input_tokens'")
        think = obj.get("think_s")
        if think is not None and (not isinstance(think, (int, float)) or think < 0):
            raise UserError(f"{where}: 'think_s' must be a number >= 0")
        conv = obj.get("conversation")
        return cls(t=float(t), output_tokens=out, input_tokens=n_in, prompt=prompt,
                   messages=[{"role": m["role"], "content": m["content"]} for m in messages] if messages else None,
                   conversation=None if conv is None else str(conv), turn=int(obj.get("turn") or 0),
                   think_s=None if think is None else float(think), images=_images(obj.get("images"), where))


def _images(raw: Any, where: str) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(i, dict) for i in raw):
        raise UserError(f"{where}: 'images' must be a list of {{width, height, format, message}}")
    out = []
    for img in raw:
        if set(img) - _IMAGE_KEYS:
            raise UserError(f"{where}: an image has unknown key(s) {', '.join(sorted(set(img) - _IMAGE_KEYS))}")
        w, h = img.get("width"), img.get("height")
        if (w is None) != (h is None) or any(v is not None and (not isinstance(v, int) or isinstance(v, bool)
                                                                 or v < 1) for v in (w, h)):
            raise UserError(f"{where}: an image's width and height are whole numbers >= 1 (or both null)")
        msg = img.get("message")
        if msg is not None and (not isinstance(msg, int) or isinstance(msg, bool) or msg < 0):
            raise UserError(f"{where}: an image's 'message' is a message index >= 0")
        if img.get("url") is not None and not isinstance(img["url"], str):
            raise UserError(f"{where}: an image's 'url' must be a string")
        out.append(dict(img))
    return out or None


def image_record(width: int | None, height: int | None, fmt: str | None, message: int | None,
                 url: str | None = None) -> dict[str, Any]:
    """One image of a trace record (what `images` holds)."""
    out: dict[str, Any] = {"width": width, "height": height, "format": fmt or "png"}
    if message is not None:
        out["message"] = message
    if url is not None:
        out["url"] = url
    return out


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[TraceRecord]]:
    """The header (empty when the file has none) and the records, sorted by arrival."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UserError(f"trace {str(p)!r}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"trace {str(p)!r}: not UTF-8 text") from None
    header: dict[str, Any] = {}
    records: list[TraceRecord] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"trace {p}: line {i} is not JSON ({e.msg})") from None
        if isinstance(obj, dict) and HEADER_KEY in obj:
            header = obj
            continue
        records.append(TraceRecord.from_json(obj, f"trace {p}: line {i}"))
    if not records:
        raise UserError(f"trace {p}: holds no request (convert a log with `autotune convert`)")
    records.sort(key=lambda r: r.t)
    return header, records


def write_trace(path: str | Path, records: Iterable[TraceRecord], header: dict[str, Any]) -> Path:
    """Write then rename: an interrupted conversion never leaves a file that looks complete."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps({HEADER_KEY: FORMAT_VERSION, **header}) + "\n")
            for r in records:
                f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {str(p)!r}: {e.strerror or e}") from None
    return p


def rebase(records: list[TraceRecord]) -> list[TraceRecord]:
    """Times from the first kept request (a window or a sample starts at 0)."""
    if records:
        t0 = records[0].t
        for r in records:
            r.t -= t0
    return records
