"""Cutting a large log down without changing its shape.

- `window(records, start, end)`: the requests that arrived in [start, end) seconds after the log's first
  request, times kept: bursts, the rate's rise and fall and the length mix within the window are exactly
  the log's. Turns whose conversation began before the window are kept (with their recorded times).
- `sample(records, n, seed)`: whole conversations (a lone request is a conversation of one) drawn
  uniformly at random, without replacement, until about `n` requests are kept, each at its recorded
  time. Length distributions, turns per conversation, think times and the rate's shape over time are
  the log's in expectation; the absolute rate falls by the kept fraction, which the replay's
  `time_scale` (or the study's capacity search by rate scaling) makes up.
"""

from __future__ import annotations

import numpy as np

from autotune.bench.trace.format import TraceRecord, rebase
from autotune.errors import UserError


def parse_window(text: str) -> tuple[float | None, float | None]:
    """`START:END` in seconds since the log's first request; either side may be empty (`:600`, `3600:`)."""
    lo, sep, hi = text.partition(":")
    if not sep:
        raise UserError(f"--window {text!r}: write START:END in seconds (e.g. 600:1200, :300, 3600:)")
    try:
        a = float(lo) if lo.strip() else None
        b = float(hi) if hi.strip() else None
    except ValueError:
        raise UserError(f"--window {text!r}: START and END are seconds since the log's first request") from None
    if a is not None and b is not None and b <= a:
        raise UserError(f"--window {text!r}: END must be after START")
    return a, b


def window(records: list[TraceRecord], start: float | None, end: float | None) -> list[TraceRecord]:
    kept = [r for r in records if (start is None or r.t >= start) and (end is None or r.t < end)]
    if not kept:
        raise UserError("the window holds no request")
    return rebase(kept)


def sample(records: list[TraceRecord], n: int, seed: int) -> list[TraceRecord]:
    if n < 1:
        raise UserError(f"--sample must be >= 1, got {n}")
    groups: dict[str, list[TraceRecord]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.conversation or f"\x00{i}", []).append(r)
    keys = list(groups)
    kept: list[TraceRecord] = []
    for k in np.random.default_rng(seed).permutation(len(keys)):
        if len(kept) >= n:
            break
        kept += groups[keys[int(k)]]
    return rebase(sorted(kept, key=lambda r: r.t))
