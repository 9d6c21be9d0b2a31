"""The client's health monitor: the collector's pauses during a step are counted and named, and the heap
that existed before the step is out of the collector's reach while it runs (and back after)."""

from __future__ import annotations

import asyncio
import gc

from autotune.bench.health import LoopMonitor


class Cycle:
    def __init__(self) -> None:
        self.me = self      # only the cyclic collector frees this


async def _step(collect: bool) -> tuple[LoopMonitor, int, int]:
    monitor = LoopMonitor(period_s=0.001)
    monitor.start()
    frozen_during = gc.get_freeze_count()
    for _ in range(3):
        await asyncio.sleep(0.005)      # the loop samples its lag
    if collect:
        made = [[] for _ in range(500_000)]   # what a step allocated: a full walk of it takes milliseconds
        gc.collect()
        del made
    await monitor.stop()
    return monitor, frozen_during, gc.get_freeze_count()


def test_a_step_freezes_the_heap_counts_collections_and_thaws_after() -> None:
    before = gc.get_freeze_count()
    Cycle()                                              # garbage from before the step
    monitor, during, after = asyncio.run(_step(collect=True))
    assert during > before                               # the heap before the step: not walked during it
    assert after == before                               # and handed back when the step ends
    assert len(monitor.gc_pauses_ms) >= 1 and all(ms >= 0 for ms in monitor.gc_pauses_ms)
    health = monitor.health()
    assert "garbage collection(s), the longest" in health.note
    assert health.note.startswith("event-loop lag p50") or health.saturated   # the lag is still reported
    assert monitor._on_gc not in gc.callbacks
    assert monitor.cpu_wait_ms is not None and monitor.cpu_wait_ms >= 0   # Linux's run delay of the loop's thread


def test_two_overlapping_steps_keep_the_heap_frozen_until_the_last_ends() -> None:
    async def two() -> tuple[int, int, int]:
        a, b = LoopMonitor(period_s=0.001), LoopMonitor(period_s=0.001)
        base = gc.get_freeze_count()
        a.start()
        b.start()
        await asyncio.sleep(0.005)
        await a.stop()
        still = gc.get_freeze_count()
        await b.stop()
        return base, still, gc.get_freeze_count()

    base, still, after = asyncio.run(two())
    assert still > base and after == base


def test_a_step_without_collections_says_nothing_of_them() -> None:
    gc.disable()                                         # no collection can start inside the step
    try:
        monitor, _, _ = asyncio.run(_step(collect=False))
    finally:
        gc.enable()
    assert monitor.gc_pauses_ms == [] and "garbage" not in monitor.health().note


def test_a_flagged_step_names_its_stalls_and_the_thread_that_ran_beside_the_loop() -> None:
    import threading
    import time

    done, release = threading.Event(), threading.Event()

    def spin() -> None:                                  # a busy thread of the same process: 50 ms of CPU
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:
            sum(range(1000))
        done.set()
        release.wait()                                   # alive when the step ends: a thread that ended is not read

    async def step() -> LoopMonitor:
        monitor = LoopMonitor(period_s=0.001)
        monitor.start()
        await asyncio.sleep(0.005)
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:                 # the loop itself blocked: one 50 ms stall
            pass
        await asyncio.sleep(0.005)
        spinner = threading.Thread(target=spin, name="busy-beside", daemon=True)
        spinner.start()
        while not done.is_set():                         # the loop runs while the thread takes its CPU
            await asyncio.sleep(0.001)
        await monitor.stop()
        release.set()
        spinner.join()
        return monitor

    monitor = asyncio.run(step())
    health = monitor.health()
    assert health.saturated                              # the 50 ms stall is over the 20 ms p99 bound
    assert "ticks over 20 ms, the longest" in health.note
    assert max(monitor.lags_ms) >= 45
    assert "busy-beside" in health.note                  # the thread that ran is named, with its CPU time
    assert any(name.startswith("busy-beside") and ms >= 30 for name, ms in monitor.others_ms.items())


def test_with_a_dump_folder_a_late_tick_leaves_the_stack_of_what_held_the_loop(tmp_path, monkeypatch) -> None:
    import os
    import time

    monkeypatch.setenv("AUTOTUNE_STALL_DUMP", str(tmp_path))

    def hold_the_loop() -> None:
        end = time.perf_counter() + 0.1                  # 100 ms: well past the 10 + 25 ms the dump waits
        while time.perf_counter() < end:
            pass

    async def step() -> None:
        monitor = LoopMonitor()
        monitor.start()
        await asyncio.sleep(0.02)
        hold_the_loop()
        await asyncio.sleep(0.02)
        await monitor.stop()

    asyncio.run(step())
    dump = (tmp_path / f"stalls-{os.getpid()}.txt").read_text()
    assert "Timeout (" in dump and "hold_the_loop" in dump
