"""When requests go out. Closed loop keeps N in flight (maps to a server's batch size, the trial runner's
default); open loop sends at a rate whatever the server does (the only way to see a queue build up)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Awaitable, Iterator, Protocol

from autotune.bench.workloads import Prompt


class Send(Protocol):
    """Sends one prompt; an open loop passes the perf_counter time the request was due, which the client
    records beside the actual send time (the schedule's drift is measured, not assumed)."""

    def __call__(self, prompt: Prompt, scheduled: float | None = None) -> Awaitable[None]: ...


class Arrivals(ABC):
    """Drives `send` with prompts until the prompts run out, `deadline` (monotonic seconds) passes or
    `stop` is set; returns when every request it started has finished."""

    mode: str = ""

    @abstractmethod
    async def drive(self, prompts: Iterator[Prompt], send: Send, *, deadline: float | None,
                    stop: asyncio.Event) -> None: ...

    @abstractmethod
    def describe(self) -> dict[str, float | str | None]:
        """What was offered, for the result's `load` record."""
