"""A recorded trace, replayed with its timing: the workload of "tune on your own traffic".

The file is the canonical trace (`autotune convert` writes it from gateway logs, ShareGPT or a CSV of
lengths; bench/trace/format.py defines it). Each request keeps its recorded prompt (or chat messages)
and its recorded completion length as `max_tokens`; a request logged with lengths only gets random text
of its length, drawn by seed. Requests come out in recorded order with their arrival times (`at_s`),
which the trace replay (arrivals/_trace.py) honours; a run that needs more requests than the window
holds replays it again after one mean gap. A request's images are sent as recorded (a kept data URI) or
made at replay with their recorded size (a lengths-only trace), a fresh image each cycle.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Iterator

import numpy as np

from autotune.bench.images import FORMATS, ImageRef, made_image
from autotune.bench.tokens import Tokenizer
from autotune.bench.trace.format import UNKNOWN_SIZE, TraceRecord, read_trace
from autotune.bench.trace.cut import window
from autotune.bench.workloads._base import Prompt, Workload, random_text
from autotune.errors import UserError


def _number(key: str, value: Any, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"workload trace: {key}={value!r} is not a number") from None
    if not (v >= 0 if allow_zero else v > 0) or v != v:
        raise UserError(f"workload trace: {key} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return v


class TraceWorkload(Workload):
    """`trace:path=FILE[,time_scale=X][,start=S][,duration=D]`: the requests that arrived from S seconds
    after the trace's start, for D seconds, sent at their recorded times multiplied by X (0.5 = twice as
    fast)."""

    kind = "trace"
    keys = ("path", "time_scale", "start", "duration")

    def __init__(self, path: str, time_scale: float = 1.0, start: float | None = None,
                 duration: float | None = None) -> None:
        self.path = str(path)
        self.time_scale = _number("time_scale", time_scale)
        self.start = None if start is None else _number("start", start, allow_zero=True)
        self.duration = None if duration is None else _number("duration", duration)
        self.header, records = read_trace(self.path)
        if self.start is not None or self.duration is not None:
            lo = self.start or 0.0
            records = window(records, lo, None if self.duration is None else lo + self.duration)
        else:
            records = window(records, None, None)
        self.records: list[TraceRecord] = records

    @property
    def size(self) -> int:
        return len(self.records)

    @property
    def max_images(self) -> int:
        return max((len(r.images or ()) for r in self.records), default=0)

    @property
    def image_sizes(self) -> tuple[tuple[int, int], ...]:
        sizes = {_size(img) for r in self.records for img in r.images or ()}
        return tuple(sorted(sizes))

    def mean_rate(self) -> float | None:
        """Requests per second as recorded (None for a trace of one instant)."""
        span = self.records[-1].t - self.records[0].t
        return (len(self.records) - 1) / span if span > 0 and len(self.records) > 1 else None

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": self.path}
        if self.time_scale != 1.0:
            out["time_scale"] = self.time_scale
        for key in ("start", "duration"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def iter_prompts(self, seed: int, tokenizer: Tokenizer | None) -> Iterator[Prompt]:
        rng = np.random.default_rng(seed)
        span = self.records[-1].t
        period = span + (span / (self.size - 1) if self.size > 1 and span > 0 else 1.0)
        cycle = 0
        while True:
            for r in self.records:
                yield self._prompt(r, rng, tokenizer, cycle * period, cycle)
            cycle += 1

    one_pass_is_sample = False

    def one_pass(self, tokenizer: Tokenizer | None, n: int = 0) -> list[Prompt]:
        return list(islice(self.iter_prompts(0, tokenizer), self.size))

    @staticmethod
    def _prompt(r: TraceRecord, rng: np.random.Generator, tokenizer: Tokenizer | None, offset: float,
                cycle: int) -> Prompt:
        messages = tuple(dict(m) for m in r.messages) if r.messages else None
        counted = r.input_tokens
        if messages is not None:
            text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        elif r.prompt is not None:
            text = r.prompt
        else:
            assert r.input_tokens is not None
            text, counted = random_text(rng, r.input_tokens, tokenizer)
        if counted is None and tokenizer is not None:
            counted = len(tokenizer.encode(text))
        conv = None if r.conversation is None else (r.conversation if not cycle else f"{r.conversation}#{cycle}")
        return Prompt(text, r.output_tokens, counted, at_s=r.t + offset, conversation=conv,
                      think_s=r.think_s if r.turn else None, messages=messages, images=_replayed(r, rng, cycle))


def _size(img: dict[str, Any]) -> tuple[int, int]:
    return (img["width"], img["height"]) if img.get("width") else UNKNOWN_SIZE


def _replayed(r: TraceRecord, rng: np.random.Generator, cycle: int) -> tuple[ImageRef, ...]:
    """The recorded image where the trace kept it (first pass only: a later cycle would replay a cached
    image), else a made one of the recorded size."""
    out = []
    for img in r.images or ():
        w, h = _size(img)
        fmt = img.get("format") if img.get("format") in FORMATS else "png"
        if img.get("url") and not cycle:
            out.append(ImageRef(w, h, fmt, img["url"], img.get("message")))
        else:
            out.append(made_image(w, h, int(rng.integers(2**62)), fmt, img.get("message")))
    return tuple(out)
