"""The OpenAI wire format the simulator speaks: prompt token counting, request validation, and the
SSE chunks of /v1/completions and /v1/chat/completions (one `data:` event per chunk, a usage chunk
last, `data: [DONE]`), shaped as vLLM sends them.

The simulator has no tokenizer: a prompt given as token ids counts exactly; text counts one token per
word or punctuation mark, which is close to a BPE count for English-like text. An image (an `image_url`
part holding a data URI) counts what the model's processor makes of its size (perfmodel/vision.py),
as tokens unique to the image's bytes, so a repeated image hits the prefix cache and a new one does not.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from autotune.bench.images import uri_size
from autotune.perfmodel.vision import VisionProfile

_WORD = re.compile(r"\w+|[^\w\s]")
_VOCAB = ("the", "model", "token", "serve", "batch", "cache", "layer", "expert", "tensor", "stream",
          "memory", "latency", "page", "block", "prefill", "decode", "router", "graph", "kernel", "queue")


class BadRequest(Exception):
    """A request vLLM would answer with HTTP 400."""


@dataclass
class ParsedRequest:
    chat: bool
    stream: bool
    prompt_tokens: list[object]
    max_tokens: int
    include_usage: bool
    continuous_usage: bool
    model: str
    images: list[tuple[int, int]] = field(default_factory=list)   # (width, height) of each image, in order
    image_tokens: int = 0


def _tokens_of(prompt: Any) -> list[object]:
    if isinstance(prompt, str):
        return list(_WORD.findall(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _tokens_of(prompt[0])
    raise BadRequest("prompt must be a string, a list of token ids, or a list with one of those")


@dataclass(frozen=True)
class ImageRules:
    """What the served model does with images: its vision profile, --mm-processor-kwargs, and how many
    images a prompt may carry (None: vLLM's default, 999)."""

    vision: VisionProfile | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    limit: int | None = None


def _image_tokens(part: dict[str, Any], rules: ImageRules | None) -> tuple[list[object], tuple[int, int]]:
    if rules is None or rules.vision is None:
        raise BadRequest("this model does not support image input (it is not a multimodal model)")
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    size = uri_size(url) if isinstance(url, str) else None
    if size is None:
        raise BadRequest("image_url must be a base64 data URI of a PNG, JPEG, GIF or WebP image "
                         "(the simulator fetches no URL)")
    w, h = size[0], size[1]
    return [("<image>", hash(url))] * rules.vision.tokens(w, h, rules.kwargs), (w, h)


def parse_request(body: Any, chat: bool, max_model_len: int, rules: ImageRules | None = None) -> ParsedRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    sizes: list[tuple[int, int]] = []
    image_tokens = 0
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        tokens: list[object] = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            tokens += ["<|role|>", str(m.get("role", "user")) if isinstance(m, dict) else "user"]
            if isinstance(content, list):  # content parts: images first, then the text, as vLLM places them
                for p in content:
                    if isinstance(p, dict) and p.get("type") == "image_url":
                        ids, size = _image_tokens(p, rules)
                        tokens += ids
                        sizes.append(size)
                        image_tokens += len(ids)
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            tokens += _tokens_of(content or "")
        tokens.append("<|assistant|>")
        limit = rules.limit if rules is not None and rules.limit is not None else 999
        if len(sizes) > limit:
            raise BadRequest(f"At most {limit} image(s) may be provided in one prompt.")
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required")
        tokens = _tokens_of(body["prompt"])
    limit = body.get("max_completion_tokens") if chat else None
    limit = limit if limit is not None else body.get("max_tokens")
    if limit is None:
        limit = min(max_model_len - len(tokens), 1024) if chat else 16
    if not isinstance(limit, int) or limit < 1:
        raise BadRequest("max_tokens must be a positive integer")
    if len(tokens) + limit > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(tokens) + limit} tokens ({len(tokens)} in the messages, {limit} in the completion). "
            "Please reduce the length of the messages or completion.")
    opts = body.get("stream_options") or {}
    return ParsedRequest(chat, bool(body.get("stream", False)), tokens, limit,
                         bool(opts.get("include_usage", False)), bool(opts.get("continuous_usage_stats", False)),
                         str(body.get("model") or ""), sizes, image_tokens)


def token_text(index: int, seed: int) -> str:
    return " " + _VOCAB[(index * 7 + seed) % len(_VOCAB)]


class ChunkWriter:
    """Builds one response's chunks; `sim_times` ride along in an extra key, ignored by OpenAI clients."""

    def __init__(self, rid: str, model: str, req: ParsedRequest):
        self.rid, self.model, self.req = rid, model, req
        self.created = int(time.time())
        self.sent_role = False

    def _base(self) -> dict[str, Any]:
        return {"id": self.rid, "object": "chat.completion.chunk" if self.req.chat else "text_completion",
                "created": self.created, "model": self.model}

    def usage(self, completion_tokens: int) -> dict[str, int]:
        p = len(self.req.prompt_tokens)
        return {"prompt_tokens": p, "completion_tokens": completion_tokens, "total_tokens": p + completion_tokens}

    def tokens(self, text: str, sim_times: list[float], finished: bool, completion_tokens: int) -> bytes:
        out = self._base()
        finish = "length" if finished else None
        if self.req.chat:
            delta: dict[str, Any] = {"content": text}
            if not self.sent_role:
                delta = {"role": "assistant", "content": text}
                self.sent_role = True
            out["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            out["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                               "stop_reason": None}]
        if self.req.continuous_usage:
            out["usage"] = self.usage(completion_tokens)
        out["autotune_sim"] = {"tokens": len(sim_times), "token_times_s": [round(t, 6) for t in sim_times]}
        return b"data: " + json.dumps(out, separators=(",", ":")).encode() + b"\n\n"

    def final(self, completion_tokens: int) -> bytes:
        out = self._base()
        out["choices"] = []
        out["usage"] = self.usage(completion_tokens)
        return b"data: " + json.dumps(out, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"

    def whole(self, text: str, completion_tokens: int) -> dict[str, Any]:
        out = self._base()
        out["object"] = "chat.completion" if self.req.chat else "text_completion"
        if self.req.chat:
            out["choices"] = [{"index": 0, "message": {"role": "assistant", "content": text},
                               "logprobs": None, "finish_reason": "length"}]
        else:
            out["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}]
        out["usage"] = self.usage(completion_tokens)
        return out


def error_body(message: str, code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}
