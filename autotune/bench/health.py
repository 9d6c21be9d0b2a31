"""Whether the load generator kept up. A client that cannot read its sockets in time stamps chunks late
and reports the delay as server latency; instead of trusting such numbers silently, we watch the event
loop's lag (a timer that should fire every 10 ms) and the process's CPU use, and flag saturation."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import psutil

from autotune.bench.results import ClientHealth

LAG_P50_LIMIT_MS = 2.0    # a typical callback waits this long: every timestamp carries that much error
LAG_P99_LIMIT_MS = 20.0   # tail stalls this long corrupt tail percentiles
CPU_LIMIT_PCT = 95.0      # of one core: the loop has no idle time left


class LoopMonitor:
    """Start before the load, stop after; `health()` says what it saw."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._proc = psutil.Process()
        self._cpu0 = 0.0
        self._t0 = 0.0
        self._t1 = 0.0
        self._cpu1 = 0.0

    def _cpu(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.period_s
            await asyncio.sleep(self.period_s)
            self.lags_ms.append(max(0.0, (time.perf_counter() - due) * 1000.0))

    def start(self) -> None:
        self._t0, self._cpu0 = time.perf_counter(), self._cpu()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._t1, self._cpu1 = time.perf_counter(), self._cpu()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def health(self) -> ClientHealth:
        wall = max(1e-9, self._t1 - self._t0)
        cpu_pct = 100.0 * (self._cpu1 - self._cpu0) / wall
        if not self.lags_ms:
            return ClientHealth(saturated=False, loop_lag_p99_ms=None, cpu_pct=round(cpu_pct, 1),
                                note="run too short to sample loop lag")
        p50, p99 = (float(x) for x in np.percentile(self.lags_ms, [50, 99]))
        reasons = []
        if p50 > LAG_P50_LIMIT_MS:
            reasons.append(f"event-loop lag p50 {p50:.1f} ms > {LAG_P50_LIMIT_MS:g} ms")
        if p99 > LAG_P99_LIMIT_MS:
            reasons.append(f"event-loop lag p99 {p99:.1f} ms > {LAG_P99_LIMIT_MS:g} ms")
        if cpu_pct > CPU_LIMIT_PCT:
            reasons.append(f"client CPU {cpu_pct:.0f}% of a core > {CPU_LIMIT_PCT:g}%")
        return ClientHealth(saturated=bool(reasons), loop_lag_p99_ms=round(p99, 3), cpu_pct=round(cpu_pct, 1),
                            note="; ".join(reasons) or f"event-loop lag p50 {p50:.2f} ms, p99 {p99:.2f} ms")
