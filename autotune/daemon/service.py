"""The daemon's life: take queued studies into the scheduler, count their time, let them leave the
queue, serve the status API, and drain on SIGTERM or Ctrl-C.

The scheduler (node/scheduler.py) runs the trials in its own thread; this loop only looks at the
queue every `--poll` seconds. An empty queue leaves the daemon idle, not exited. A study this host
may not join (another GPU model, engine version or spec) is refused with one line in the log and left
in the queue for the hosts that may; it is tried again only when it is resubmitted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.daemon.api import StatusServer, check_listen, read_token
from autotune.node.heartbeat import Heartbeats
from autotune.daemon.metrics import BusyClock, Reading, registry_for, render
from autotune.node.pool import GpuPool, host_name, parse_gpus
from autotune.daemon.queue import CANCELLED, QUEUED, Entry, StudyQueue, create_tables, submit_to
from autotune.daemon.resolve import spec_for_daemon
from autotune.node.scheduler import Scheduler
from autotune.daemon.status import live_daemons, study_rows
from autotune.errors import UserError
from autotune.store.repository import ResultStore, sqlite_path
from autotune.store.urls import mask_url
from autotune.tuner.driver import StudyDriver, expected_trial_s


@dataclass
class Held:
    """A study this daemon has handed to its scheduler."""

    entry: Entry
    driver: StudyDriver
    stopped: bool = False      # cancelled or out of time here: no new trials


class Daemon:
    def __init__(self, storage: str, gpus: list[int], *, listen: str, token: str | None, grace_s: float,
                 log_root: Path, poll_s: float) -> None:
        self.storage, self.gpus, self.grace_s, self.poll_s = storage, gpus, grace_s, poll_s
        self.host = host_name()
        self.listen_host, self.listen_port = check_listen(listen, token)   # refused before anything starts
        self.token = token
        self.log_dir = log_root / self.host
        self.stop = threading.Event()
        self.stop_reason: str | None = None
        self.held: dict[str, Held] = {}
        self.refused: dict[str, tuple[dt.datetime, str]] = {}   # name -> (submitted_at, why)
        self.busy = BusyClock(gpus)
        self.started_at = dt.datetime.now(dt.timezone.utc)
        self._started = time.monotonic()
        self.registry = registry_for(self._reading)     # this daemon's own Prometheus registry

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Daemon":
        gpus = parse_gpus(args.gpus)
        token = read_token(args.token_file)
        return cls(args.storage, gpus, listen=args.listen, token=token, grace_s=args.grace,
                   log_root=Path(args.log_dir) if args.log_dir else default_log_root(args.storage), poll_s=args.poll)

    # -- life -----------------------------------------------------------------------------------------
    def run(self) -> int:
        create_tables(self.storage)
        self.queue = StudyQueue(self.storage)
        self.store = ResultStore(self.storage)
        self.heartbeats = Heartbeats(self.store.engine, host=self.host)
        self.heartbeats.process_info = {"role": "daemon", "gpus": self.gpus,
                                        "listen": f"{self.listen_host}:{self.listen_port}"}
        self.pool = GpuPool.for_host(self.gpus, physical=_physical())
        self.scheduler = Scheduler(self.pool)
        self.api = StatusServer(self.listen_host, self.listen_port, self.token, status=self.status,
                                metrics=self.metrics, actions={"submit": self._submit, "cancel": self._cancel})
        self.api.start()
        self.heartbeats.start()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        self.say(f"daemon on {self.host} (pid {os.getpid()}): gpus {','.join(map(str, self.gpus))}, "
                 f"storage {mask_url(self.storage)}, status on http://{self.listen_host}:{self.api.port}, "
                 f"logs in {self.log_dir}")
        worker = threading.Thread(target=self.scheduler.serve, args=(self.stop, self.grace_s),
                                  name="scheduler", daemon=True)
        worker.start()
        try:
            while not self.stop.is_set():
                self._poll()
                # a bug in the scheduler: say so, do not idle forever. Not when a signal set `stop` during
                # the poll: the scheduler returns on it at once, and this loop would have read that exit as
                # a crash (CI: a SIGTERM after the study was done ended the daemon with 1)
                if not worker.is_alive() and not self.stop.is_set():
                    self.say("the scheduler stopped unexpectedly; exiting")
                    return 1
                self.stop.wait(self.poll_s)
            self.say(f"{self.stop_reason}: draining (no new trials; running ones get {self.grace_s:g} s)")
            while worker.is_alive():
                worker.join(timeout=self.poll_s)
                self._poll(take_new=False)
            self._poll(take_new=False)
        finally:   # the scheduler closes the drivers (at the end of the drain, or when one is done)
            for s, h in old.items():
                signal.signal(s, h)
            self.api.stop()
            self.heartbeats.stop()
        self.say("drained; exiting")
        return 0

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.stop.is_set():
            self.stop_reason = signal.Signals(signum).name
            self.stop.set()

    def say(self, text: str) -> None:
        """One line on stdout and in LOG_ROOT/HOST/daemon.log (an overnight terminal may be gone)."""
        line = f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S} {self.host} {mask_url(text)}"
        # one write: print() writes the text and its newline apart, and a trial's phase line printed by
        # another thread in between joined this one (a test read "...report.html  [trial 3] stopping server")
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / "daemon.log", "a") as f:
                f.write(line + "\n")
        except OSError:
            pass

    # -- the queue ------------------------------------------------------------------------------------
    def _poll(self, take_new: bool = True) -> None:
        try:
            self._poll_once(take_new)
        except Exception as e:  # the database is away for a moment: the next poll tries again
            self.say(f"cannot work the queue now ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")

    def _poll_once(self, take_new: bool) -> None:
        entries = {e.name: e for e in self.queue.entries((QUEUED, CANCELLED))}
        snap = self.scheduler.snapshot()
        running_here = {r["study"] for r in snap["running"]}
        for name, e in entries.items():
            held = self.held.get(name)
            if e.state == QUEUED and take_new and held is None and self._may_take(e):
                self._take(e)
            elif held is not None and not held.stopped and e.state == CANCELLED:
                self._stop(held, now=e.cancel_now, why="cancelled")
        for name, held in list(self.held.items()):
            self._account(held, entries.get(name), name in running_here)
        self.busy.update({s for r in snap["running"] for s in r["slots"]})
        # what runs here rides on this daemon's heartbeat, so `status --storage` shows every host's GPUs
        self.heartbeats.process_info = {**self.heartbeats.process_info, "state": "draining" if self.stop.is_set()
                                        else "running", "running": [{k: r[k] for k in ("study", "trial", "slots", "phase")}
                                                                    for r in snap["running"]]}

    def _may_take(self, e: Entry) -> bool:
        refused = self.refused.get(e.name)
        if refused is None:
            return True
        if refused[0] == e.submitted_at:
            return False            # refused by this host until it is resubmitted
        del self.refused[e.name]
        return True

    def _take(self, e: Entry) -> None:
        from autotune.tuner.after_budget import register as register_after_budget
        from autotune.tuner.command import prepare_spec

        try:
            raw = spec_for_daemon(e.spec, self.storage, e.n_trials, dict(os.environ))
            parts = prepare_spec(raw, f"queued study {e.name}", None)
            driver = StudyDriver(**parts, live=False, heartbeats=self.heartbeats, host=self.host)
            driver.open()
        except UserError as err:
            self.refused[e.name] = (e.submitted_at, str(err))
            self.say(f"refused {e.name}: {err}")
            return
        except Exception as err:    # e.g. the database away: tried again at the next poll
            self.say(f"cannot open {e.name} now ({type(err).__name__}: {err})")
            return
        # trial logs in a folder per host: LOG_ROOT/HOST/STUDY/trial-NNNN.log
        driver.log_dir = driver.runner.log_dir = self.log_dir / e.name
        driver.log_dir.mkdir(parents=True, exist_ok=True)
        # once it has its trials: the confirmation (when its spec enables it), then LOG_DIR/report.html,
        # as a job of the scheduler beside the other studies' trials
        register_after_budget(driver, report=driver.log_dir / "report.html", say=self.say)
        self.held[e.name] = Held(e, driver)
        self.scheduler.add(driver, priority=e.priority)
        self.say(f"took {e.name} (priority {e.priority}, {e.n_trials} trials"
                 + (f", {e.budget_left_s():.0f} s of its time budget left)" if e.time_budget_s else ")"))

    def _stop(self, held: Held, *, now: bool, why: str) -> None:
        held.stopped = True
        self.scheduler.cancel(held.entry.name, now=now)
        self.say(f"{held.entry.name}: {why}; " + ("running trials interrupted" if now else "no new trials"))

    def _account(self, held: Held, entry: Entry | None, running_here: bool) -> None:
        """Count its time while a trial of it runs here; let it leave the queue when it is done."""
        name, driver = held.entry.name, held.driver
        if running_here:
            used = self.queue.tick(name, cap_s=max(3 * self.poll_s, 10.0))
            budget = held.entry.time_budget_s
            if budget is not None and not held.stopped:
                left = budget - used
                expected = expected_trial_s(self.store.trial_times(driver.record.id)) or 0.0
                if left <= 0 or left < expected:
                    self._stop(held, now=False, why=f"time budget: {used:.0f} of {budget:.0f} s used")
                    self.queue.finish(name, f"time budget spent ({used:.0f} of {budget:.0f} s)")
        elif entry is not None and entry.state == QUEUED and entry.time_budget_s is not None \
                and entry.budget_left_s() is not None and entry.budget_left_s() <= 0 and not held.stopped:
            self._stop(held, now=False, why="time budget spent")        # spent by trials on other hosts
            self.queue.finish(name, f"time budget spent ({entry.seconds_used:.0f} of {entry.time_budget_s:.0f} s)")
        if entry is None and not held.stopped:    # done or cancelled elsewhere
            self._stop(held, now=False, why="left the queue")
        if name not in self.scheduler.studies() and driver.done():   # the scheduler has closed it
            # a confirmation cut by the drain keeps the study queued: the next daemon continues it
            finished = driver.after_budget_finished or not driver.after_budget
            if driver.budget_reached() and finished and self.queue.finish(name, f"{driver.n_trials} trial(s) complete"):
                self.say(f"{name}: done, {driver.n_trials} trial(s) complete")
            del self.held[name]

    def gpus_now(self, snap: dict[str, Any]) -> list[dict[str, Any]]:
        """Each slot of the pool and what runs on it, with its phase."""
        on = {s: r for r in snap["running"] for s in r["slots"]}
        out = []
        for slot in snap["pool"]["slots"]:
            r = on.get(slot, {})
            out.append({"slot": slot, "gpu": slot if snap["pool"]["physical"] else None,
                        "study": r.get("study"), "trial": r.get("trial"), "role": r.get("role"),
                        "phase": r.get("phase"), "running_s": r.get("running_s"), "cores": r.get("cores")})
        return out

    # -- what the API serves ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        snap = self.scheduler.snapshot()
        rows = study_rows(self.store, self.queue.entries())
        for r in rows:
            if r["name"] in self.refused:
                r["refused_here"] = self.refused[r["name"]][1]
        return {"daemon": {"host": self.host, "pid": os.getpid(), "storage": mask_url(self.storage),
                           "state": "draining" if self.stop.is_set() else "running", "gpus": self.gpus,
                           "started_at": self.started_at.isoformat(timespec="seconds"),
                           "log_dir": str(self.log_dir)},
                "daemons": live_daemons(self.store.engine), "studies": rows, "gpus": self.gpus_now(snap),
                "scheduler": snap["studies"]}

    def metrics(self) -> str:
        return render(self.registry)

    def _reading(self) -> Reading:
        """What a scrape reports: the queue's studies' trials (every host), this daemon's slots and jobs."""
        entries = self.queue.entries()
        trials = {}
        for e in entries:
            rec = self.store.study(e.name)
            if rec is not None:
                trials[e.name] = self.store.trial_times(rec.id)
        return Reading(trials, self.busy.seconds(), self.host, queue_states=Counter(e.state for e in entries),
                       draining=self.stop.is_set(), uptime_s=time.monotonic() - self._started,
                       running=len(self.scheduler.snapshot()["running"]))

    def _submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return submit_to(self.storage, body)

    def _cancel(self, body: dict[str, Any]) -> dict[str, Any]:
        e = self.queue.cancel(str(body.get("name")), now=bool(body.get("now")))
        return {"cancelled": e.name, "now": e.cancel_now}


def default_log_root(storage: str) -> Path:
    path = sqlite_path(storage)
    return (path.parent if path is not None else Path.cwd()) / "autotune-logs"


def _physical() -> bool:
    """Real GPUs (CUDA_VISIBLE_DEVICES per lease) where NVML sees any; virtual slots otherwise."""
    from autotune.tuner.host import nvml_gpus
    return bool(nvml_gpus())
