"""ShareGPT conversations (`conversations`/`conversation`: `{"from": "human"|"gpt"|"system", "value"}`,
one JSON object a line or one JSON array) as multi-turn traffic. The format has no times, so
conversations start as a seeded Poisson process at `rate` per second and each turn follows the previous
answer after `think_s` seconds; every human turn with a reply becomes one request carrying the whole
conversation so far, the reply's length its output length.

Images: LLaVA-style records name image files (`image`, or a list `images`, relative to the ShareGPT file)
whose `<image>` placeholders in the human turns say where each goes (without one, the first human turn);
OpenAI-style `content` lists carry `image_url` parts. Each image is kept with its size (read from the
file's or data URI's header; unknown when the file is not there) and every later turn of the
conversation carries it again, as a chat client resends it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from autotune.bench.trace.conversations import Timed
from autotune.bench.images import data_uri, image_size
from autotune.bench.trace.fields import TokenCounter, content_images, content_text, logged_image
from autotune.bench.trace.format import TraceRecord, image_record
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
        images = _placed_images(item, turns, path.parent)
        history: list[dict[str, str]] = []
        k = 0
        for i, (role, text, _) in enumerate(turns):
            if role == "user" and i + 1 < len(turns) and turns[i + 1][0] == "assistant" and text.strip():
                msgs = history + [{"role": "user", "content": text}]
                seen = [img for img in images if img["message"] <= i]
                rec = TraceRecord(t=start + k * think_s + 1e-6 * k, output_tokens=max(1, counter.count(turns[i + 1][1])),
                                  input_tokens=counter.count_messages(msgs) or None, messages=msgs,
                                  conversation=conv, turn=k, think_s=think_s if k else None,
                                  images=[dict(img) for img in seen] or None)
                out.append(Timed(rec))
                k += 1
            history = history + [{"role": role, "content": text}]
        start += float(rng.exponential(1.0 / rate))
    if not out:
        raise UserError(f"{path.name}: no conversation with a human turn and a reply")
    return out


_PLACEHOLDER = re.compile(r"<image>\n?")


def _turns(item: Any) -> list[tuple[str, str, list[str | None]]]:
    """(role, text, image URLs of an OpenAI content list) per turn, `<image>` placeholders left in the text
    for `_placed_images` to count and then taken out."""
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
        raw = t.get("value", t.get("content"))
        text = content_text(raw)
        if role and text is not None:
            out.append((role, text, content_images(raw)))
    return out


def _placed_images(item: dict[str, Any], turns: list[tuple[str, str, list[str | None]]],
                   base: Path) -> list[dict[str, Any]]:
    """Each image with the index of its turn; the turns' texts lose their `<image>` placeholders (in place)."""
    files = item.get("images", item.get("image"))
    files = [files] if isinstance(files, str) else [f for f in files if isinstance(f, str)] \
        if isinstance(files, list) else []
    out: list[dict[str, Any]] = []
    first_user = next((i for i, t in enumerate(turns) if t[0] == "user"), 0)
    pending = list(files)
    for i, (role, text, urls) in enumerate(turns):
        out += [logged_image(url, i) for url in urls]
        for _ in _PLACEHOLDER.findall(text):
            if pending:
                out.append(_file_image(base / pending.pop(0), i))
        turns[i] = (role, _PLACEHOLDER.sub("", text), urls)
    out += [_file_image(base / f, first_user) for f in pending]
    return sorted(out, key=lambda img: img["message"])


def _file_image(path: Path, message: int) -> dict[str, Any]:
    """An image file named by the record: its size and bytes where it can be read, else unknown size."""
    try:
        data = path.read_bytes()
    except OSError:
        return image_record(None, None, None, message)
    size = image_size(data)
    if size is None:
        return image_record(None, None, None, message)
    return image_record(size[0], size[1], size[2], message, data_uri(data, size[2]))
