"""When requests go out. Closed loop keeps N in flight (maps to a server's batch size, the trial runner's
default); open loop sends at a rate whatever the server does (the only way to see a queue build up)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Awaitable, Callable, Iterator

from autotune.bench.workloads import Prompt

Send = Callable[[Prompt], Awaitable[None]]


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
