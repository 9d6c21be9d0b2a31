"""One scheduler behind `run` and `daemon`: job sources (a study's driver, node/jobs.py) by priority lease
disjoint GPU sets from the pool, each job runs in its own job thread (the trial's measurement then in a
worker process of its own, node/worker.py), and signals reach every running job. It knows jobs, not
studies: nothing here imports the tuner.

Rules (docs/SCHEDULER.md): higher priority first, round robin within a priority; no pre-emption of a
running trial; a candidate is asked for only when a slot is free (so it is chosen with every result
known so far); head-of-line reservation: when the first study in line has a candidate that does not
fit the free slots, nothing behind it leases until it fits, so a large layout is not starved by a
stream of small ones (no backfill: trial lengths are not known in advance). A job thread lives exactly as
long as its job, which is what the servers' and workers' parent-death signal needs.

A study's after-budget work (its confirmation's rounds, the daemon's report) is more jobs of the same
kind: once the study is done, each waits in line for a lease (the GPUs its repeats need), runs in a job
thread behind a gate, and the study is closed only after the last one ends. The main loop never blocks
on them."""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from autotune import causes
from autotune.node.heartbeat import interval_s
from autotune.node.interrupts import Gate, Interrupted, _interrupts, set_gate
from autotune.node.jobs import AFTER_BUDGET, Job, JobSource, NodeJob
from autotune.node.pool import GpuPool, Lease
from autotune.store.reconnect import patient

log = logging.getLogger(__name__)
_STOP_WAIT_S = 120.0      # how long interrupted workers get to stop their servers


class _signals(_interrupts):
    """SIGINT/SIGTERM/the deadline as `Interrupted` in the main thread, but held while the main thread
    is in a short critical step (asking, reaping, re-queueing) and raised right after it."""

    def __init__(self, deadline: float | None) -> None:
        super().__init__(None, deadline)
        self.hold = False
        self.pending: str | None = None

    def _raise(self, reason: str) -> None:
        if self.hold:
            self.pending = self.pending or reason
            return
        super()._raise(reason)

    def __call__(self) -> "_signals":
        return self

    def critical(self) -> "_held":
        return _held(self)


class _held:
    def __init__(self, signals: _signals) -> None:
        self.signals = signals

    def __enter__(self) -> None:
        self.signals.hold = True

    def __exit__(self, *exc: Any) -> None:
        self.signals.hold = False
        if self.signals.pending is not None and exc[0] is None:
            reason, self.signals.pending = self.signals.pending, None
            raise Interrupted(reason)


@dataclass
class _Entry:
    driver: JobSource
    priority: int
    seq: int
    pending: Job | None = None   # asked, waiting for slots (it holds the head of the line)
    waiting_since: float = 0.0


@dataclass
class _Worker:
    entry: _Entry
    job: Job
    lease: Lease
    gate: Gate = field(default_factory=Gate)
    phase: str = "starting"
    started: float = field(default_factory=time.time)
    thread: threading.Thread | None = None


class Scheduler:
    def __init__(self, pool: GpuPool, *, parallel: int | None = None, poll_s: float = 0.2) -> None:
        """`parallel`: most trials at once in this process (`run --parallel N`); None = as many as the
        pool holds (`daemon`)."""
        self.pool = pool
        self.parallel = parallel
        self.poll_s = poll_s
        self._entries: list[_Entry] = []
        self._workers: dict[tuple[str, int], _Worker] = {}
        self._finished: queue.Queue[_Worker | None] = queue.Queue()   # None: `serve`'s stop was set
        self._storage_error: BaseException | None = None   # a worker found the storage unwritable
        self._lock = threading.RLock()
        self._seq = 0
        self._last_recover = 0.0
        self.recover_every_s = interval_s()
        self.closed: list[tuple[JobSource, Any]] = []    # (driver, StudyResult) in the order they ended

    # -- studies ------------------------------------------------------------------------------------
    def add(self, driver: JobSource, priority: int = 0) -> None:
        """Open the driver (if not yet) and queue it by priority."""
        if not getattr(driver, "_opened", False):
            driver.open()
        with self._lock:
            self._seq += 1
            self._entries.append(_Entry(driver, priority, self._seq))
            self._entries.sort(key=lambda e: (-e.priority, e.seq))
        if len(self._entries) > 1 or (self.parallel or 2) > 1:
            driver.tag_phases = True

    def studies(self) -> list[str]:
        with self._lock:
            return [e.driver.name for e in self._entries]

    def cancel(self, study: str, now: bool = False) -> None:
        """No new trials of `study` (a candidate of it waiting for slots is re-queued at the next pass);
        with `now`, its running trials are interrupted (and re-queued). Any thread may call it."""
        with self._lock:
            for e in self._entries:
                if e.driver.name == study:
                    e.driver.cancelled = True
            workers = [w for w in self._workers.values() if w.job.study == study]
        if now:
            for w in workers:
                w.gate.interrupt("cancel")

    # -- the two ways to run ------------------------------------------------------------------------
    def run_until_done(self) -> str | None:
        """`run`: until every study is done; SIGINT/SIGTERM/the deadline interrupt every running trial at
        once (re-queued). Returns the stop reason (None, "timeout", "SIGINT", "SIGTERM")."""
        deadlines = [e.driver.deadline for e in self._entries if e.driver.deadline is not None]
        reason: str | None = None
        with _signals(min(deadlines) if deadlines else None) as signals:
            try:
                while self._entries:
                    with signals.critical():
                        self._tick(leasing=True)
                    for e in self._finished_entries():
                        self._close(e)
                    if self._entries:
                        self._wait(self.poll_s)
            except Interrupted as e:
                reason = e.reason
                signals.hold = True             # further signals while the servers stop are noted only
                self._stop_all(reason)
        for e in list(self._entries):
            if reason is not None and e.driver.stop_reason is None:
                e.driver.stop_reason = reason
            self._close(e)
        stops = [d.stop_reason for d, _ in self.closed if d.stop_reason]
        return reason or (stops[0] if stops else None)

    def serve(self, stop: threading.Event, grace_s: float) -> None:
        """`daemon`: until `stop` is set; then no new trials, running ones get `grace_s` to finish, the
        rest are interrupted (re-queued). Drivers that are done are closed; the daemon adds new ones.
        A finished trial wakes the loop, so its slot is leased again at once, not at the next poll."""
        threading.Thread(target=self._wake_on, args=(stop,), name="scheduler-stop", daemon=True).start()
        while not stop.is_set():
            try:
                self._tick(leasing=True)
                for e in self._finished_entries():
                    self._close(e)
            except Exception as exc:    # a database that is briefly locked or unreachable: next pass
                log.warning("scheduler pass failed: %s", exc)
                stop.wait(min(5.0, 10 * self.poll_s))
            self._wait(self.poll_s)
        for e in self._entries:
            self._drop_pending(e, "drain")
        end = time.monotonic() + grace_s
        while self._workers and time.monotonic() < end:
            self._tick(leasing=False)
            self._wait(min(self.poll_s, max(0.0, end - time.monotonic())))
        self._stop_all("drain")
        for e in list(self._entries):
            self._close(e)

    # -- one pass -----------------------------------------------------------------------------------
    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        self._finished.put(None)

    def _wait(self, seconds: float) -> None:
        """Until a worker finishes (or `serve`'s stop is set), at most `seconds`; what woke it stays queued
        for `_reap`."""
        try:
            w = self._finished.get(timeout=seconds)
            self._finished.put(w)
        except queue.Empty:
            pass

    def _tick(self, leasing: bool) -> None:
        self._reap()
        for e in list(self._entries):
            if e.pending is not None and e.driver.cancelled:
                self._drop_pending(e, "cancel")
        now = time.monotonic()
        if now - self._last_recover >= self.recover_every_s:
            self._last_recover = now
            for e in list(self._entries):
                try:
                    e.driver.recover()
                except Exception as exc:        # a locked/unreachable database: next time
                    log.warning("recovery of %s failed: %s", e.driver.name, exc)
            self._check_lost()
        if leasing:
            self._launch()

    def _finished_entries(self) -> list[_Entry]:
        """Studies with nothing pending or running that are done, their after-budget job included."""
        return [e for e in list(self._entries) if e.pending is None and e.driver.done()
                and not self._has_workers(e) and not e.driver.after_budget_due()]

    def _after_budget_job(self, e: _Entry) -> Job | None:
        """The study's next after-budget job, when one is due (its trials done, none of them running here).
        It leases the GPUs its work asks for on a GPU host, one slot on virtual ones (CPU build, simulator).
        Several may run at once when the study packs its after-budget work (the confirmation's rounds)."""
        d = e.driver
        if self._has_workers(e, trials_only=True) or not d.after_budget_due():
            return None
        n = d.after_budget_gpus() if self.pool.physical else 1
        d.after_budget_started = True       # taken now, in this loop: a source is never asked twice for one
        with self._lock:
            self._seq += 1
            number = -self._seq             # unique among this study's jobs (trials have numbers >= 0)
        return NodeJob(study=d.name, number=number, n_gpus=n, exclusive=bool(d.exclusive))

    def _drop_pending(self, e: _Entry, reason: str) -> None:
        """A job waiting for slots that will not start: a trial is re-queued; an after-budget job is left
        for the next run (its study records the stop, unless it was cancelled)."""
        job, e.pending = e.pending, None
        if job is None:
            return
        if job.role != AFTER_BUDGET:
            e.driver.interrupt(job, reason)
        elif reason != "cancel" and e.driver.stop_reason is None:
            e.driver.stop_reason = reason

    def _has_workers(self, e: _Entry, trials_only: bool = False) -> bool:
        return any(w.entry is e and not (trials_only and w.job.role == AFTER_BUDGET) for w in self._workers.values())

    def _line(self) -> list[_Entry]:
        """Who leases first: higher priority; within a priority, a candidate already waiting for slots
        (the longest-waiting first), then the study that leased least recently (round robin)."""
        with self._lock:
            return sorted(self._entries, key=lambda e: (-e.priority, e.waiting_since if e.pending else float("inf"),
                                                        e.seq))

    def _launch(self) -> None:
        blocked = False          # the head of the line waits for slots: the others only join the line
        for e in self._line():
            if e.driver.cancelled:
                continue                    # its waiting candidate is re-queued by the next _tick
            while self.parallel is None or len(self._workers) < self.parallel:
                if e.pending is None:
                    if not self.pool.free():
                        return              # nothing can start: ask later, with more results known
                    e.pending = self._after_budget_job(e)
                    if e.pending is None:
                        if not e.driver.wants_trial():
                            break
                        e.pending = e.driver.next_job()
                    e.waiting_since = time.monotonic()
                    if e.pending is None:
                        continue            # a free check rejected it (told); ask again
                if blocked:
                    break
                job = e.pending
                n = job.n_gpus if self.pool.physical else min(job.n_gpus, len(self.pool.slots))
                if n > len(self.pool.slots):
                    e.pending = None
                    why = f"needs {n} GPUs; this host's pool has {len(self.pool.slots)}"
                    if job.role == AFTER_BUDGET:    # left for a host that has them
                        e.driver.after_budget_started = e.driver.after_budget_finished = True
                        e.driver.progress.message(f"after-budget steps not run here: {why}")
                    else:
                        e.driver.fail(job, causes.CONSTRAINT, why)
                    continue
                lease = self.pool.try_lease(n, exclusive=job.exclusive)
                if lease is None:
                    blocked = True          # head-of-line reservation: nothing behind it leases
                    break
                e.pending = None
                with self._lock:                # round robin within a priority: it goes to the back
                    self._seq += 1
                    e.seq = self._seq
                self._start(e, job, lease)
            else:
                return

    def _start(self, e: _Entry, job: Job, lease: Lease) -> None:
        w = _Worker(e, job, lease)
        record = e.driver.phase_for(job) if job.role != AFTER_BUDGET else e.driver.progress.phase

        def phase(text: str) -> None:
            w.phase = text
            record(text)

        def after_budget() -> None:
            set_gate(w.gate)
            try:
                e.driver.run_after_budget(lease, phase)
            except Interrupted as exc:              # the rows stored so far stay: the next run continues
                e.driver.stop_reason = e.driver.stop_reason or exc.reason
            except Exception:                       # a bug in a step: record it, close the study anyway
                log.error("after-budget steps of %s: %s", job.study, traceback.format_exc())
                e.driver.after_budget_finished = True     # not retried forever by a daemon
            finally:
                set_gate(None)
                self._finished.put(w)

        def body() -> None:
            set_gate(w.gate)
            try:
                try:
                    outcome = e.driver.run_job(job, lease, phase)
                except Interrupted as exc:
                    e.driver.interrupt(job, exc.reason)
                    return
                except Exception as exc:            # a bug, not a candidate's failure: record it, go on
                    log.error("trial %s of %s: %s", job.number, job.study, traceback.format_exc())
                    e.driver.fail(job, causes.CRASH, f"autotune error: {exc!r}")
                    return
                e.driver.finish(job, lease, outcome)
            except Interrupted as exc:              # arrived after the runner's gate closed
                e.driver.interrupt(job, exc.reason)
            finally:
                set_gate(None)
                self._finished.put(w)

        with self._lock:
            self._workers[(job.study, job.number)] = w

        def patient_body() -> None:
            try:
                with patient():     # this job's writes wait out a database restart (store/reconnect.py)
                    (after_budget if job.role == AFTER_BUDGET else body)()
            except Exception as exc:
                from autotune.store.repository import storage_failure

                if storage_failure(exc) is None:
                    raise
                # a full or read-only disk: the main thread stops the run with one line (cli.py), not
                # this thread with a traceback
                self._storage_error = self._storage_error or exc

        w.thread = threading.Thread(target=patient_body, daemon=True,
                                    name=f"{AFTER_BUDGET}-{job.study}" if job.role == AFTER_BUDGET
                                    else f"trial-{job.study}-{job.number}")
        w.thread.start()

    def _reap(self) -> None:
        if self._storage_error is not None:
            raise self._storage_error
        while True:
            try:
                w = self._finished.get_nowait()
            except queue.Empty:
                return
            if w is None:
                continue
            if w.thread is not None:
                w.thread.join(timeout=5)
            self.pool.release(w.lease)
            with self._lock:
                self._workers.pop((w.job.study, w.job.number), None)

    def _check_lost(self) -> None:
        """A trial another process has failed (our heartbeats did not reach the database in time) is
        stopped: its parameters were already re-queued by that process."""
        for w in list(self._workers.values()):
            if w.job.role != AFTER_BUDGET and not w.entry.driver.still_ours(w.job):
                w.gate.interrupt("lost")

    def _stop_all(self, reason: str) -> None:
        """Interrupt every running trial and wait for their servers to stop; pending jobs re-queued."""
        for e in self._entries:
            self._drop_pending(e, reason)
        for w in list(self._workers.values()):
            w.gate.interrupt(reason)
        end = time.monotonic() + _STOP_WAIT_S
        while self._workers and time.monotonic() < end:
            self._reap()
            self._wait(0.1)
        self._reap()

    def _close(self, e: _Entry) -> None:
        with self._lock:
            if e not in self._entries:
                return
            self._entries.remove(e)
        self.closed.append((e.driver, e.driver.close()))

    # -- what /status serves ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            workers = list(self._workers.values())
            entries = list(self._entries)
        return {
            "host": self.pool.host,
            "pool": {"slots": list(self.pool.slots), "free": list(self.pool.free()), "physical": self.pool.physical},
            "running": [{"study": w.job.study, "trial": w.job.number if w.job.number >= 0 else None, "role": w.job.role, "slots": list(w.lease.slots),
                         "gpus": list(w.lease.gpus), "cores": list(w.lease.cores), "port": w.lease.port,
                         "phase": w.phase, "running_s": round(time.time() - w.started, 1)} for w in workers],
            "studies": [{"name": e.driver.name, "priority": e.priority, "n_trials": e.driver.n_trials,
                         "cancelled": e.driver.cancelled, "waiting_for_slots": e.pending.n_gpus if e.pending else None,
                         "running_here": sum(1 for w in workers if w.entry is e)} for e in entries],
        }
