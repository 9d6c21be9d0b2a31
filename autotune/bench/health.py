"""Whether the load generator kept up. A client that cannot read its sockets in time stamps chunks late
and reports the delay as server latency; instead of trusting such numbers silently, we watch the event
loop's lag (a timer that should fire every 10 ms) and the process's CPU use, and flag saturation."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import threading
import time
from typing import TextIO

import numpy as np
import psutil

from autotune.bench.results import ClientHealth

LAG_P50_LIMIT_MS = 2.0    # a typical callback waits this long: every timestamp carries that much error
LAG_P99_LIMIT_MS = 20.0   # tail stalls this long corrupt tail percentiles
CPU_LIMIT_PCT = 95.0      # of one core: the loop has no idle time left


class _FrozenHeap:
    """Python's cyclic collector stops every thread of the process while it walks the tracked objects,
    and a measurement worker holds ~380,000 of them (transformers' tokenizer brings torch): one full
    collection took 180 ms on the quiet two-core machine, a pause the client would stamp on every chunk
    in flight. During a step the objects that existed before it are moved out of the collector's reach
    (`gc.freeze`; a full collection then took under 0.1 ms), so a collection walks only what the step
    allocated; they go back after the last step running in this process ends (steps of several slots
    may share one process: counted, not nested)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0

    def hold(self) -> None:
        with self._lock:
            if self._holders == 0:
                gc.freeze()
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                gc.unfreeze()


FROZEN = _FrozenHeap()


def _cpu_wait_s() -> float | None:
    """Seconds this thread has waited runnable for a CPU (Linux's schedstat run delay): a loop stall with
    as much waiting was another process on the client's core, one without was inside the client."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _steal_s() -> float | None:
    """Seconds the hypervisor kept this process's CPUs from running anything (/proc/stat's steal, summed
    over the cores the process may use): a guest stall that no runqueue in the guest shows."""
    try:
        cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
        with open("/proc/stat") as f:
            return sum(int(parts[8]) for parts in (line.split() for line in f)
                       if parts and parts[0] in cpus and len(parts) > 8) * _TICK_S
    except (OSError, ValueError, AttributeError):
        return None


def _other_threads_s() -> dict[str, float]:
    """CPU seconds of this process's other threads, by name: one that ran while the loop stalled held the
    interpreter lock the loop's thread was waiting for (a wait no runqueue shows either)."""
    me, out = threading.get_native_id(), {}
    names = {str(t.native_id): t.name for t in threading.enumerate()}   # the OS knows only "python"
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        if tid == str(me):
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = names.get(tid) or stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        out[f"{name}[{tid}]"] = (int(fields[11]) + int(fields[12])) * _TICK_S   # utime + stime
    return out


STALL_DUMP_ENV = "AUTOTUNE_STALL_DUMP"   # a folder: where a step's stalls are caught, one file per process
STALL_DUMP_AFTER_S = 0.025               # a tick this late dumps every thread's stack


def _stall_dump() -> TextIO | None:
    """The open dump file when AUTOTUNE_STALL_DUMP names a folder. What the counts in a step's note cannot
    say is where the loop's thread was; Python's fault handler dumps every thread's stack from a C thread
    of its own when a tick is late, so a stall inside a system call or behind the interpreter lock is
    caught where it happened (how the socket() stalls on the GPU host were found). The handler's timer is
    one per process: steps that share a process (`run --parallel 1` runs them in threads) re-arm each
    other's, so there a dump is a sample, not every stall."""
    folder = os.environ.get(STALL_DUMP_ENV)
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return open(os.path.join(folder, f"stalls-{os.getpid()}.txt"), "a")


class LoopMonitor:
    """Start before the load, stop after; `health()` says what it saw, the collector's pauses included."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._proc = psutil.Process()
        self._cpu0 = 0.0
        self._t0 = 0.0
        self._t1 = 0.0
        self._cpu1 = 0.0
        self.gc_pauses_ms: list[float] = []
        self._gc_t0 = 0.0
        self._wait0: float | None = None
        self.cpu_wait_ms: float | None = None    # the loop's thread waiting for a CPU during the step
        self._steal0: float | None = None
        self.steal_ms: float | None = None       # the hypervisor's, on the process's cores
        self._others0: dict[str, float] = {}
        self.others_ms: dict[str, float] = {}    # the process's other threads' CPU during the step

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0:
            self.gc_pauses_ms.append((time.perf_counter() - self._gc_t0) * 1000.0)
            self._gc_t0 = 0.0

    def _cpu(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    async def _run(self) -> None:
        dump = _stall_dump()
        try:
            while True:
                due = time.perf_counter() + self.period_s
                if dump is not None:     # fires from C, without the interpreter lock, if this tick is late
                    faulthandler.dump_traceback_later(self.period_s + STALL_DUMP_AFTER_S, file=dump)
                await asyncio.sleep(self.period_s)
                self.lags_ms.append(max(0.0, (time.perf_counter() - due) * 1000.0))
        finally:
            if dump is not None:
                faulthandler.cancel_dump_traceback_later()
                dump.close()

    def start(self) -> None:
        FROZEN.hold()
        gc.callbacks.append(self._on_gc)
        self._t0, self._cpu0 = time.perf_counter(), self._cpu()
        self._wait0 = _cpu_wait_s()
        self._steal0 = _steal_s()
        self._others0 = _other_threads_s()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._t1, self._cpu1 = time.perf_counter(), self._cpu()
        wait1 = _cpu_wait_s()
        if self._wait0 is not None and wait1 is not None:
            self.cpu_wait_ms = (wait1 - self._wait0) * 1000.0
        steal1 = _steal_s()
        if self._steal0 is not None and steal1 is not None:
            self.steal_ms = (steal1 - self._steal0) * 1000.0
        self.others_ms = {k: (v - self._others0.get(k, 0.0)) * 1000.0 for k, v in _other_threads_s().items()}
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
            gc.callbacks.remove(self._on_gc)
            FROZEN.release()

    def _where(self) -> list[str]:
        """Where a flagged step's stalls may have come from, each as measured during the step."""
        out = []
        stalls = [x for x in self.lags_ms if x > LAG_P99_LIMIT_MS]
        out.append(f"{len(stalls)} of {len(self.lags_ms)} ticks over {LAG_P99_LIMIT_MS:g} ms, "
                   f"the longest {max(self.lags_ms):.0f} ms")
        if self.cpu_wait_ms is not None:
            out.append(f"the loop's thread waited {self.cpu_wait_ms:.0f} ms in all for a CPU")
        if self.steal_ms is not None:
            out.append(f"the hypervisor stole {self.steal_ms:.0f} ms of the process's cores")
        busy = sorted(((ms, name) for name, ms in self.others_ms.items() if ms >= 1.0), reverse=True)
        if busy:
            out.append("other threads ran " + ", ".join(f"{name} {ms:.0f} ms" for ms, name in busy[:3]))
        return out

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
        saturated = bool(reasons)
        if not reasons:
            reasons.append(f"event-loop lag p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        if saturated:
            reasons.extend(self._where())
        gc_ms = max(self.gc_pauses_ms, default=0.0)
        if gc_ms >= 1.0:   # what a stall may have been: the collector's pauses stop every thread
            reasons.append(f"{len(self.gc_pauses_ms)} garbage collection(s), the longest {gc_ms:.0f} ms")
        return ClientHealth(saturated=saturated, loop_lag_p99_ms=round(p99, 3), cpu_pct=round(cpu_pct, 1),
                            note="; ".join(reasons))
