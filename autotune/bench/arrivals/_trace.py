"""Trace replay: every request at its recorded arrival time (`Prompt.at_s`) times `time_scale`, open
loop; a later turn of a conversation after the previous turn's answer plus its think time.

All requests are read and scheduled before the first is due (a step's requests, or those due before
the deadline), each as a task that sleeps until its time; so a burst is a set of timers that fire
together, not a loop that must get round to each request, and a later turn is ready the moment the
answer it follows arrives. Each send carries its scheduled time, and the client records it beside the
actual one: how far the replay drifted from the trace is measured, not assumed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

from autotune.bench.arrivals._base import Arrivals, Send
from autotune.bench.workloads import Prompt
from autotune.errors import UserError


class TraceReplay(Arrivals):
    """`time_scale` multiplies every recorded interval (0.5 replays twice as fast, 2 at half speed)."""

    mode = "trace"

    def __init__(self, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise UserError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = float(time_scale)
        self.offered_rate: float | None = None

    def _read(self, prompts: Iterator[Prompt], horizon: float | None) -> list[Prompt]:
        out: list[Prompt] = []
        base: float | None = None
        for p in prompts:
            if p.at_s is None:
                raise UserError("a trace replay needs requests with arrival times (workload trace:path=FILE)")
            base = p.at_s if base is None else base
            if horizon is not None and (p.at_s - base) * self.time_scale >= horizon:
                break
            out.append(p)
        return out

    async def drive(self, prompts: Iterator[Prompt], send: Send, *, deadline: float | None,
                    stop: asyncio.Event) -> None:
        todo = self._read(prompts, None if deadline is None else deadline - time.perf_counter())
        if not todo:
            return
        scale, base = self.time_scale, todo[0].at_s or 0.0
        t0 = time.perf_counter()
        done_at: dict[str, float] = {}
        last: dict[str, asyncio.Task[None]] = {}

        async def one(p: Prompt, due: float, before: asyncio.Task[None] | None) -> None:
            if before is not None:                      # a later turn: after the answer it follows
                await asyncio.wait({before})
                answered = done_at.get(p.conversation or "", due)
                due = answered + p.think_s * scale if p.think_s is not None else max(due, answered)
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if stop.is_set() or (deadline is not None and due >= deadline):
                return
            await send(p, scheduled=due)
            if p.conversation is not None:
                done_at[p.conversation] = time.perf_counter()

        tasks = []
        for p in todo:
            before = last.get(p.conversation) if p.conversation is not None else None
            task = asyncio.create_task(one(p, t0 + ((p.at_s or 0.0) - base) * scale, before))
            if p.conversation is not None:
                last[p.conversation] = task
            tasks.append(task)
        span = ((todo[-1].at_s or 0.0) - base) * scale
        self.offered_rate = (len(todo) - 1) / span if len(todo) > 1 and span > 0 else None
        await asyncio.gather(*tasks)

    def describe(self) -> dict[str, float | str | None]:
        return {"mode": self.mode, "time_scale": self.time_scale, "request_rate": self.offered_rate,
                "concurrency": None}
