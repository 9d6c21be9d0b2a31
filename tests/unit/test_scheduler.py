"""The scheduler's own rules, with stand-in drivers (no servers): priority, head-of-line reservation,
exclusive studies, interrupts that reach every worker thread, and the drain of `serve`."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

from autotune.node.pool import GpuPool, Lease
from autotune.node.scheduler import Scheduler
from autotune.tuner.driver import TrialJob
from autotune.node.interrupts import interruptible
from autotune.tuner.trial import TrialOutcome

T0 = time.monotonic()


class FakeDriver:
    """The parts of StudyDriver the scheduler calls; each job holds its lease for `durations[i]`."""

    def __init__(self, name: str, n_gpus: int, durations: list[float], arrive_s: float = 0.0,
                 exclusive: bool = False, log: list | None = None, after_budget_s: float | None = None,
                 after_budget_gpus: int = 1) -> None:
        self.name, self.n_gpus, self.durations, self.arrive_s = name, n_gpus, list(durations), arrive_s
        self.exclusive = exclusive
        self.log = log if log is not None else []
        self.deadline = None
        self.n_trials = len(durations)
        self.cancelled = False
        self.stop_reason: str | None = None
        self.tag_phases = False
        self._opened = True
        self.asked = 0
        self.running = 0
        self.interrupted: list[tuple[int, str]] = []
        self.finished: list[int] = []
        self.closed = False
        self._lock = threading.Lock()
        self.after_budget_s, self.budget_gpus = after_budget_s, after_budget_gpus   # None: no after-budget steps
        self.after_budget_started = self.after_budget_finished = False
        self.progress = SimpleNamespace(phase=lambda text: None, message=lambda text: None)
        self.spec = SimpleNamespace(exclusive=exclusive)

    def wants_trial(self) -> bool:
        return (not self.cancelled and self.asked < len(self.durations)
                and time.monotonic() - T0 >= self.arrive_s)

    def next_job(self) -> TrialJob:
        self.asked += 1
        return TrialJob(self.name, self.asked - 1, self.asked, "search", {}, [], self.n_gpus, self.exclusive)

    def run_job(self, job: TrialJob, lease: Lease, phase: Any) -> TrialOutcome:
        with self._lock:
            self.running += 1
        self.log.append(("start", self.name, job.number, time.monotonic() - T0, lease.slots))
        try:
            with interruptible():
                end = time.monotonic() + self.durations[job.number]
                while time.monotonic() < end:
                    time.sleep(0.01)
        finally:
            with self._lock:
                self.running -= 1
            self.log.append(("end", self.name, job.number, time.monotonic() - T0, lease.slots))
        return TrialOutcome("ok")

    def finish(self, job: TrialJob, lease: Lease | None, outcome: TrialOutcome) -> None:
        self.finished.append(job.number)

    def interrupt(self, job: TrialJob, reason: str) -> None:
        self.interrupted.append((job.number, reason))

    def done(self) -> bool:
        return (self.cancelled or self.stop_reason is not None or len(self.finished) + len(self.interrupted)
                >= len(self.durations)) and self.running == 0

    def recover(self) -> None:
        pass

    def after_budget_due(self) -> bool:
        return (self.after_budget_s is not None and not self.after_budget_started and not self.cancelled
                and self.stop_reason is None and len(self.finished) >= len(self.durations) and self.running == 0)

    def after_budget_gpus(self) -> int:
        return self.budget_gpus

    def run_after_budget(self, lease: Lease, phase: Any) -> None:
        """Like a confirmation: holds its lease for `after_budget_s`, interruptible by the gate."""
        self.after_budget_started = True
        self.log.append(("start", self.name, -1, time.monotonic() - T0, lease.slots))
        try:
            with interruptible():
                end = time.monotonic() + (self.after_budget_s or 0.0)
                while time.monotonic() < end:
                    time.sleep(0.01)
        finally:
            self.log.append(("end", self.name, -1, time.monotonic() - T0, lease.slots))
        self.after_budget_finished = True

    def still_ours(self, job: TrialJob) -> bool:
        return True

    def phase_for(self, job: TrialJob) -> Any:
        return lambda text: None

    def close(self) -> str:
        self.closed = True
        return "closed"


def _when(ready: Any, act: Any) -> None:
    """Run `act()` on a thread as soon as `ready()` holds (polled, up to 60 s): the test acts on an event
    (a trial running, a job started), not after a delay that a busy machine can outrun."""
    def run() -> None:
        end = time.monotonic() + 60
        while not ready() and time.monotonic() < end:
            time.sleep(0.005)
        act()
    threading.Thread(target=run, daemon=True).start()


def _never_overlapping(log: list) -> None:
    held: dict[int, str] = {}
    for kind, name, number, _, slots in sorted(log, key=lambda e: (e[3], e[0] == "start")):
        for s in slots:
            if kind == "start":
                assert s not in held, f"slot {s} leased twice"
                held[s] = name
            else:
                held.pop(s, None)


def test_a_large_layout_is_not_starved_by_small_ones() -> None:
    global T0
    T0 = time.monotonic()
    log: list = []
    small = FakeDriver("small", 1, [0.15, 0.25, 0.35, 0.45] + [0.1] * 8, log=log)
    big = FakeDriver("big", 4, [0.1], arrive_s=0.05, log=log)
    sched = Scheduler(GpuPool([0, 1, 2, 3], physical=True, cores=range(4), host="h"), poll_s=0.01)
    sched.add(small, priority=0)
    sched.add(big, priority=0)
    assert sched.run_until_done() is None
    starts = {(e[1], e[2]): e[3] for e in log if e[0] == "start"}
    big_start = starts[("big", 0)]
    # Once the big candidate waits, no small one jumps the line; only the one small candidate that was
    # already waiting when it arrived goes first. It starts as soon as all 4 are free (the last small
    # trial of the first wave ends at 0.45 s), not after the remaining eight small ones.
    first_wave_end = max(e[3] for e in log if e[0] == "end" and e[1] == "small" and e[2] < 4)
    jumped = [k for k, t in starts.items() if k[0] == "small" and k[1] >= 4 and t < big_start]
    assert jumped in ([], [("small", 4)])
    assert all(starts[("small", i)] > big_start for i in range(5, 12))
    assert big_start - first_wave_end < 2.0
    assert len(small.finished) == 12 and big.finished == [0] and small.closed and big.closed
    _never_overlapping(log)


def test_higher_priority_first_and_exclusive_runs_alone() -> None:
    global T0
    T0 = time.monotonic()
    log: list = []
    low = FakeDriver("low", 1, [0.05] * 4, log=log)
    high = FakeDriver("high", 1, [0.05] * 4, log=log)
    alone = FakeDriver("alone", 1, [0.05, 0.05], exclusive=True, log=log)
    sched = Scheduler(GpuPool([0, 1], physical=False, cores=[0, 1], host="h"), poll_s=0.01)
    sched.add(low, priority=0)
    sched.add(alone, priority=5)
    sched.add(high, priority=1)
    sched.run_until_done()
    order = [e[1] for e in sorted(log, key=lambda e: e[3]) if e[0] == "start"]
    assert order[:2] == ["alone", "alone"] and order.index("low") > order.index("high")
    ex = [(e[3], e[0]) for e in log if e[1] == "alone"]
    spans = [(s, t) for (s, a), (t, b) in zip(sorted(ex)[::2], sorted(ex)[1::2])]
    for e in log:
        if e[1] != "alone" and e[0] == "start":
            assert not any(s < e[3] < t for s, t in spans), "something ran beside an exclusive trial"
    _never_overlapping(log)


def test_sigterm_interrupts_every_running_trial_at_once() -> None:
    global T0
    T0 = time.monotonic()
    d = FakeDriver("s", 1, [30.0, 30.0, 30.0])
    sched = Scheduler(GpuPool([0, 1, 2], physical=False, cores=[0], host="h"), parallel=3, poll_s=0.01)
    sched.add(d)
    _when(lambda: d.running == 3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    t = time.monotonic()
    assert sched.run_until_done() == "SIGTERM"
    assert time.monotonic() - t < 15                       # not the trials' 30 s
    assert sorted(d.interrupted) == [(0, "SIGTERM"), (1, "SIGTERM"), (2, "SIGTERM")] and d.running == 0
    assert sched.pool.free() == (0, 1, 2)


def _two_studies(first: FakeDriver, second: FakeDriver, slots: int = 2) -> Scheduler:
    global T0
    T0 = time.monotonic()
    sched = Scheduler(GpuPool(list(range(slots)), physical=False, cores=[0], host="h"), poll_s=0.01)
    sched.add(first)
    sched.add(second)
    return sched


def test_cancel_now_interrupts_one_study_only() -> None:
    a, b = FakeDriver("a", 1, [30.0]), FakeDriver("b", 1, [0.3])
    sched = _two_studies(a, b)
    _when(lambda: a.running == 1, lambda: sched.cancel("a", now=True))
    assert sched.run_until_done() is None
    assert a.interrupted == [(0, "cancel")] and b.finished == [0]


def test_cancel_requeues_a_candidate_waiting_for_slots() -> None:
    busy = FakeDriver("busy", 2, [2.0])
    waiting = FakeDriver("waiting", 2, [0.1], arrive_s=0.05)     # asked (1 slot free), waits for 2
    sched = _two_studies(busy, waiting, slots=3)
    _when(lambda: waiting.asked == 1, lambda: sched.cancel("waiting"))
    assert sched.run_until_done() is None
    assert waiting.interrupted == [(0, "cancel")] and waiting.finished == [] and busy.finished == [0]


def test_serve_drains_within_grace_then_interrupts() -> None:
    quick, slow = FakeDriver("quick", 1, [0.05]), FakeDriver("slow", 1, [30.0])
    sched = _two_studies(quick, slow)
    stop = threading.Event()
    _when(lambda: quick.running == slow.running == 1, stop.set)
    t = time.monotonic()
    sched.serve(stop, grace_s=0.5)
    assert time.monotonic() - t < 15                       # not slow's 30 s
    assert quick.finished == [0] and slow.interrupted == [(0, "drain")]
    assert snapshot_ok(sched.snapshot())


def test_serve_leases_a_freed_slot_when_its_trial_ends_not_at_the_next_poll() -> None:
    """With an hour between polls, only the finished trial's own wake-up can start the next one on the
    single slot, and only the stop's wake-up can end the loop (the daemon's loop used to sleep the poll)."""
    global T0
    T0 = time.monotonic()
    d = FakeDriver("a", 1, [0.0, 0.0, 0.0])
    sched = Scheduler(GpuPool([0], physical=False, cores=[0], host="h"), poll_s=3600)
    sched.add(d)
    stop = threading.Event()
    _when(lambda: len(d.finished) == 3, stop.set)
    serving = threading.Thread(target=sched.serve, args=(stop, 0.0), daemon=True)
    serving.start()
    serving.join(timeout=120)
    assert not serving.is_alive() and d.finished == [0, 1, 2] and d.closed


def snapshot_ok(snap: dict) -> bool:
    return snap["running"] == [] and snap["pool"]["free"] == [0, 1] and snap["host"] == "h"


def test_after_budget_job_holds_a_lease_beside_other_studies_trials() -> None:
    """Study a's after-budget job (its confirmation) leases a slot in a worker thread: b's trials keep
    starting while it runs, and a is closed only after it ends."""
    log: list = []
    a = FakeDriver("a", 1, [0.05], log=log, after_budget_s=0.6)
    b = FakeDriver("b", 1, [0.1] * 6, arrive_s=0.1, log=log)
    sched = _two_studies(a, b)
    assert sched.run_until_done() is None
    job = [(e[0], e[3], e[4]) for e in log if e[1] == "a" and e[2] == -1]
    assert [k for k, _, _ in job] == ["start", "end"] and len(job[0][2]) == 1
    start, end = job[0][1], job[1][1]
    inside = [e for e in log if e[1] == "b" and e[0] == "start" and start < e[3] < end]
    assert len(inside) >= 2, f"b's trials did not start while a's after-budget job ran: {log}"
    assert a.after_budget_finished and a.closed and [d.name for d, _ in sched.closed][-1] == "b"
    _never_overlapping(log)
    assert sched.pool.free() == (0, 1)


def test_sigterm_interrupts_the_after_budget_job_and_keeps_it_for_the_next_run() -> None:
    global T0
    T0 = time.monotonic()
    d = FakeDriver("s", 1, [0.05], after_budget_s=30.0)
    sched = Scheduler(GpuPool([0, 1], physical=False, cores=[0], host="h"), parallel=2, poll_s=0.01)
    sched.add(d)
    _when(lambda: d.after_budget_started, lambda: os.kill(os.getpid(), signal.SIGTERM))
    t = time.monotonic()
    assert sched.run_until_done() == "SIGTERM"
    assert time.monotonic() - t < 15                       # not the job's 30 s
    assert d.after_budget_started and not d.after_budget_finished and d.stop_reason == "SIGTERM" and d.closed
    assert sched.pool.free() == (0, 1)


def test_drain_gives_the_after_budget_job_its_grace_then_interrupts_it() -> None:
    a, b = FakeDriver("a", 1, [0.05], after_budget_s=30.0), FakeDriver("b", 1, [])
    sched = _two_studies(a, b)
    stop = threading.Event()
    stopped: list[float] = []
    _when(lambda: a.after_budget_started, lambda: (stopped.append(time.monotonic()), stop.set()))
    sched.serve(stop, grace_s=0.5)
    took = time.monotonic() - stopped[0]
    assert 0.5 <= took < 15, took                          # its grace, then interrupted (not its 30 s)
    assert a.after_budget_started and not a.after_budget_finished and a.stop_reason == "drain" and a.closed


def test_an_after_budget_job_that_fits_no_pool_is_skipped_not_retried() -> None:
    d = FakeDriver("s", 1, [0.05], after_budget_s=1.0, after_budget_gpus=4)
    sched = Scheduler(GpuPool([0, 1], physical=True, cores=[0], host="h"), poll_s=0.01)
    sched.add(d)
    assert sched.run_until_done() is None
    assert d.after_budget_started and d.after_budget_finished and d.closed
    assert not any(e[2] == -1 for e in d.log)
