"""Open loop: Poisson (burstiness 1) or gamma inter-arrival times at a set rate, seeded; optionally capped
at a number in flight, as `vllm bench serve --request-rate R --max-concurrency N` does."""

from __future__ import annotations

import asyncio
import math
import time
from itertools import islice
from typing import Iterator

import numpy as np

from autotune.bench.arrivals._base import Arrivals, Send
from autotune.bench.workloads import Prompt


class OpenLoop(Arrivals):
    """Gamma intervals with shape `burstiness` and mean 1/rate: coefficient of variation 1/sqrt(burstiness),
    so burstiness < 1 clusters requests and > 1 evens them out. `rate=inf` sends everything at once."""

    mode = "rate"

    def __init__(self, rate: float, burstiness: float = 1.0, seed: int = 0, cap: int | None = None,
                 exact_n: int | None = None) -> None:
        if not rate > 0:
            raise ValueError("rate must be > 0")
        if not burstiness > 0:
            raise ValueError("burstiness must be > 0")
        self.rate, self.burstiness, self.seed, self.cap = float(rate), float(burstiness), seed, cap
        self.exact_n = exact_n

    def gaps(self) -> Iterator[float]:
        """Seconds between sends, without end; the first request goes at once, like vLLM's client.

        With `exact_n`, the first exact_n - 1 gaps are scaled so that they average exactly 1/rate: a
        200-request step keeps its Poisson shape but offers the rate it claims (one seed's draw can
        otherwise run 10 % slow, and a capacity search compares steps that share a seed)."""
        rng = np.random.default_rng(self.seed)
        yield 0.0
        if self.exact_n and self.exact_n > 1 and not math.isinf(self.rate):
            first = rng.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness), size=self.exact_n - 1)
            yield from (first * ((self.exact_n - 1) / self.rate / first.sum())).tolist()
        while True:
            yield 0.0 if math.isinf(self.rate) else \
                float(rng.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness)))

    def intervals(self, n: int) -> np.ndarray:
        """The first `n` gaps (what tests check the statistics of)."""
        return np.fromiter(islice(self.gaps(), n), dtype=float, count=n)

    async def drive(self, prompts: Iterator[Prompt], send: Send, *, deadline: float | None,
                    stop: asyncio.Event) -> None:
        slots = asyncio.Semaphore(self.cap) if self.cap else None
        tasks: set[asyncio.Task[None]] = set()

        async def one(p: Prompt, due: float) -> None:
            if slots is None:
                await send(p, scheduled=due)   # capped sends wait for a slot by design: no schedule to hold
                return
            async with slots:
                if not stop.is_set():
                    await send(p)

        due = time.perf_counter()
        for gap in self.gaps():
            if stop.is_set():
                break
            due += gap
            if deadline is not None and due >= deadline:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    break
                except asyncio.TimeoutError:
                    pass
            prompt = next(prompts, None)
            if prompt is None:
                break
            task = asyncio.create_task(one(prompt, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    def describe(self) -> dict[str, float | str | None]:
        return {"mode": self.mode, "request_rate": self.rate, "burstiness": self.burstiness,
                "concurrency": self.cap}
