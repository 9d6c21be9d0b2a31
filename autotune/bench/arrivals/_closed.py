"""Closed loop: N workers, each sends its next request the moment its last one ends."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

from autotune.bench.arrivals._base import Arrivals, Send
from autotune.bench.workloads import Prompt


class ClosedLoop(Arrivals):
    """Exactly `concurrency` requests in flight (fewer only while the last ones drain)."""

    mode = "concurrency"

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.concurrency = int(concurrency)

    async def drive(self, prompts: Iterator[Prompt], send: Send, *, deadline: float | None,
                    stop: asyncio.Event) -> None:
        async def worker() -> None:
            while not stop.is_set() and (deadline is None or time.perf_counter() < deadline):
                prompt = next(prompts, None)
                if prompt is None:
                    return
                await send(prompt)

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def describe(self) -> dict[str, float | str | None]:
        return {"mode": self.mode, "concurrency": self.concurrency, "request_rate": None}
