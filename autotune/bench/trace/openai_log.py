"""OpenAI-style request/response logs, one JSON object a line, as gateways and proxies write them:

    {"timestamp": "2025-06-01T10:00:00.120Z", "request": {"model": "m", "messages": [...], "max_tokens": 256},
     "response": {"choices": [{"message": {"content": "..."}}], "usage": {"prompt_tokens": 412,
                  "completion_tokens": 87}}, "duration_ms": 2310}

The request may sit under `request` or `body` (or be the line itself); the arrival time under
`timestamp`, `time`, `start_time`, `created_at` or `ts` (else the response's `created`); the answer's end
under `end_time` / `finished_at`, or a length `duration_ms` / `latency_ms` / `duration_s`. Chat
(`messages`) and completion (`prompt`) requests are both read. Token counts: the response's `usage`
when logged, else the model's tokenizer over the text; the output length falls back to the request's
`max_tokens` when the log has neither. Images in the messages (`image_url` parts) are kept with their
size and their message (format.py); a data URI's size is read from its bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.bench.trace.conversations import Timed
from autotune.bench.trace.fields import TokenCounter, content_images, content_text, logged_image, parse_time
from autotune.bench.trace.format import TraceRecord
from autotune.errors import UserError

_START_KEYS = ("timestamp", "time", "start_time", "created_at", "ts", "request_time")
_END_KEYS = ("end_time", "finished_at", "completed_at", "response_time")
_LENGTH_KEYS = {"duration_ms": 1e-3, "latency_ms": 1e-3, "duration_s": 1.0, "latency_s": 1.0}


def read_openai_log(path: Path, counter: TokenCounter) -> list[Timed]:
    out: list[Timed] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name}: line {i}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object")
        out.append(_entry(obj, where, counter))
    if not out:
        raise UserError(f"{path}: no request in the log")
    return out


def _entry(obj: dict[str, Any], where: str, counter: TokenCounter) -> Timed:
    req = obj.get("request", obj.get("body", obj))
    resp = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    if not isinstance(req, dict):
        raise UserError(f"{where}: 'request' is not an object")
    start = _first(obj, _START_KEYS)
    if start is None:
        start = _first(resp, ("created",))
    t = parse_time(start, where)
    record = TraceRecord(t=t, output_tokens=1)
    if isinstance(req.get("messages"), list):
        msgs = []
        images = []
        for m in req["messages"]:
            text = content_text(m.get("content")) if isinstance(m, dict) else None
            if text is not None and isinstance(m.get("role"), str):
                images += [logged_image(url, len(msgs)) for url in content_images(m.get("content"))]
                msgs.append({"role": m["role"], "content": text})
        if not msgs:
            raise UserError(f"{where}: the request's messages hold no text")
        record.messages = msgs
        record.images = images or None
    elif isinstance(req.get("prompt"), str):
        record.prompt = req["prompt"]
    else:
        raise UserError(f"{where}: the request has neither 'messages' nor a string 'prompt'")
    usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else {}
    n_in = usage.get("prompt_tokens")
    record.input_tokens = int(n_in) if isinstance(n_in, int) and n_in > 0 else (
        counter.count_messages(record.messages) if record.messages else counter.count(record.prompt or "")) or None
    record.output_tokens = _output_tokens(req, resp, usage, counter, where)
    return Timed(record, _end(obj, t, where))


def _output_tokens(req: dict[str, Any], resp: dict[str, Any], usage: dict[str, Any], counter: TokenCounter,
                   where: str) -> int:
    n = usage.get("completion_tokens")
    if isinstance(n, int) and n > 0:
        return n
    answer = _answer(resp)
    if answer:
        return max(1, counter.count(answer))
    cap = req.get("max_completion_tokens", req.get("max_tokens"))
    if isinstance(cap, int) and cap > 0:
        return cap
    raise UserError(f"{where}: no completion length (no usage, no answer text, no max_tokens)")


def _answer(resp: dict[str, Any]) -> str:
    choices = resp.get("choices")
    if not isinstance(choices, list):
        return ""
    texts = []
    for c in choices[:1]:
        if isinstance(c, dict):
            msg = c.get("message") if isinstance(c.get("message"), dict) else {}
            text = content_text(msg.get("content")) if msg else c.get("text")
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts)


def _end(obj: dict[str, Any], start: float, where: str) -> float | None:
    end = _first(obj, _END_KEYS)
    if end is not None:
        return parse_time(end, where)
    for key, unit in _LENGTH_KEYS.items():
        v = obj.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            return start + float(v) * unit
    return None


def _first(obj: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if obj.get(k) is not None:
            return obj[k]
    return None
