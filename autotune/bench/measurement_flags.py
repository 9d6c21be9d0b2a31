"""Measurement flags: what makes a figure not to be trusted on its own (DESIGN.md keeps the words).

A flagged measurement still counts as data, but a trial carrying a flag is never exported unconfirmed:
`client_saturated` (the load generator was the bottleneck, latencies include its own lag),
`prefix_hits` (the prefix cache served prompts that were meant to be new, so prefill was skipped),
`wide_bracket` (the capacity search ended with its highest met and lowest broken load far apart, so the
capacity is known only loosely), `overlapped` (another trial ran on the same machine at the same time;
set by the scheduler), `jit_compile` (the server JIT-compiled a kernel during a load step and again
during that step's re-run, so the step measured compiles; engine/logwatch.py).
"""

from __future__ import annotations

from typing import Iterable

CLIENT_SATURATED = "client_saturated"
PREFIX_HITS = "prefix_hits"
WIDE_BRACKET = "wide_bracket"
OVERLAPPED = "overlapped"
JIT_COMPILE = "jit_compile"
ALL = (CLIENT_SATURATED, PREFIX_HITS, WIDE_BRACKET, OVERLAPPED, JIT_COMPILE)

# Random prompts share nothing but the chat template's few tokens: more than this share of prompt
# tokens served from the cache means a replay (same seed twice, a reset that did not happen).
PREFIX_HIT_PCT = 1.0


def prefix_flattered(hit_pct: float | None, workload_kind: str) -> bool:
    """True when a run on prompts meant to be new was served from the prefix cache beyond a small share."""
    return workload_kind == "random" and (hit_pct or 0.0) > PREFIX_HIT_PCT


def merge(*groups: Iterable[str]) -> list[str]:
    """Flags of several measurements, each once, in DESIGN.md's order."""
    seen = {f for g in groups for f in g}
    return [f for f in ALL if f in seen]
