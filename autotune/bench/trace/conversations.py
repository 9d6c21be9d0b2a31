"""Which requests are turns of one conversation: a chat request whose messages begin with all of an
earlier request's messages (and add the answer and the next question) continues that request.

Chained hashes of the message list make the check linear in the messages; two identical openings (two
users both saying "hi" under one system prompt) are told apart by taking the most recent request not
already continued.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.bench.trace.format import TraceRecord


@dataclass
class Timed:
    """A request as a log gives it: the record, and when its answer ended (None when not logged)."""

    record: TraceRecord
    end_t: float | None = None


def _chain(messages: list[dict[str, str]]) -> list[int]:
    out, h = [], 0
    for m in messages:
        h = hash((h, m["role"], m["content"]))
        out.append(h)
    return out


def link_turns(items: list[Timed]) -> None:
    """Set conversation, turn and think time on the records of `items` (sorted by arrival, times in seconds
    since the trace's start). Think time is the gap between the previous turn's answer and this request,
    known only when the log recorded when answers ended."""
    open_ends: dict[int, list[int]] = {}     # chained hash of a request's whole messages -> item indices
    conv_of: list[str] = []
    next_id = 0
    for i, item in enumerate(items):
        r = item.record
        msgs = r.messages or []
        chain = _chain(msgs)
        parent = None
        for length in range(len(msgs) - 1, 0, -1):
            waiting = open_ends.get(chain[length - 1])
            if waiting:
                parent = waiting.pop()
                break
        if parent is None:
            conv_of.append(f"c{next_id}")
            next_id += 1
            r.turn = 0
        else:
            prev = items[parent]
            conv_of.append(conv_of[parent])
            r.turn = prev.record.turn + 1
            if prev.end_t is not None:
                r.think_s = max(0.0, r.t - prev.end_t)
        if chain:
            open_ends.setdefault(chain[-1], []).append(i)
    sizes: dict[str, int] = {}
    for c in conv_of:
        sizes[c] = sizes.get(c, 0) + 1
    for item, c in zip(items, conv_of):
        # a single request is no conversation: only turns that continue one another are chained
        item.record.conversation = c if sizes[c] > 1 else None
        if item.record.conversation is None:
            item.record.turn = 0
