"""What `autotune status` and the daemon's `/status` say about each study: where it stands in the
queue, its trials so far, its best feasible trial, and when it should finish.

Read from the database alone, so `status --storage` answers with no daemon running; a daemon adds
what only it knows (its GPUs, what runs on each and in which phase) around these rows.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Sequence

from sqlalchemy.engine import Engine

from autotune.daemon.queue import QUEUED, Entry
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import best_trial
from autotune.store.repository import ResultStore
from autotune.tuner.driver import expected_trial_s

FINISHED = ("ok", "infeasible", "failed")   # told to Optuna as COMPLETE: they count towards n_trials


def study_rows(store: ResultStore | None, entries: Sequence[Entry], now: dt.datetime | None = None) -> list[dict[str, Any]]:
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    rows = []
    for e in entries:
        rec = store.study(e.name) if store is not None else None
        trials = store.trials(rec.id) if rec is not None else []
        rows.append(_row(e, rec, trials, now))
    return rows


def _row(e: Entry, rec: StudyRecord | None, trials: list[TrialRecord], now: dt.datetime) -> dict[str, Any]:
    complete = sum(t.state in FINISHED for t in trials)
    running = [t for t in trials if t.state == "running"]
    state = e.state if e.state != QUEUED else ("running" if running else "queued")
    row: dict[str, Any] = {
        "name": e.name, "state": state, "priority": e.priority, "n_trials": e.n_trials, "complete": complete,
        "running": sorted(t.number for t in running),
        "failed": sum(t.state == "failed" for t in trials),
        "interrupted": sum(t.state == "interrupted" for t in trials),
        "seconds_used": round(e.seconds_used, 1), "time_budget_s": e.time_budget_s,
        "reason": e.reason, "submitted_at": e.submitted_at.isoformat(timespec="seconds"),
        "simulated": (e.spec.get("engine") or {}).get("kind") == "sim",
        "best": None, "median_trial_s": None, "expected_finish": None,
    }
    if rec is not None:
        best = best_trial(rec, trials)
        if best is not None:
            row["best"] = {"trial": best.number, "objectives": best.objectives, "params": best.params,
                           "simulated": best.simulated}
    median = expected_trial_s(trials)
    if median is not None:
        row["median_trial_s"] = round(median, 1)
    if e.state == QUEUED and median is not None:
        row["expected_finish"] = _expected_finish(e, complete, len(running), median, now)
    return row


def _expected_finish(e: Entry, complete: int, running: int, median_s: float, now: dt.datetime) -> str:
    """The remaining trials at the median trial time, in waves as wide as the trials running now
    (at least one); never past what the time budget leaves."""
    remaining = max(e.n_trials - complete, 0)
    waves = math.ceil(remaining / max(running, 1))
    eta = waves * median_s
    left = e.budget_left_s()
    if left is not None:
        eta = min(eta, max(left, 0.0))
    return (now + dt.timedelta(seconds=eta)).isoformat(timespec="seconds")


def live_daemons(engine: Engine) -> list[dict[str, Any]]:
    """The daemons (and `run`s) whose process heartbeat is fresh, on any host."""
    from autotune.node.heartbeat import Heartbeats

    return [{"host": b.host, "pid": b.pid, "heartbeat_age_s": round(b.age_s, 1), **(b.info or {})}
            for b in Heartbeats(engine).live_processes()]


def render(body: dict[str, Any]) -> str:
    """The text `autotune status` prints: one block per study, then the daemon's GPUs when known."""
    lines = []
    if body.get("daemon"):
        d = body["daemon"]
        lines.append(f"daemon {d['host']} pid {d['pid']}: {d['state']}, storage {d['storage']}")
    for d in body.get("daemons") or []:
        lines.append(f"daemon {d['host']} pid {d['pid']}: heartbeat {d['heartbeat_age_s']:.0f} s ago"
                     + (f", gpus {','.join(map(str, d['gpus']))}" if d.get("gpus") else ""))
        for r in d.get("running") or []:
            lines.append(f"  gpu {','.join(map(str, r['slots']))}: {r['study']} trial #{r['trial']}: {r['phase'] or ''}")
    for s in body["studies"]:
        label = " (SIMULATED)" if s["simulated"] else ""
        lines.append(f"{s['name']}{label}: {s['state']}, priority {s['priority']}, "
                     f"{s['complete']}/{s['n_trials']} trials" + (f", running #{', #'.join(map(str, s['running']))}"
                                                                  if s["running"] else ""))
        if s["best"]:
            objs = ", ".join(f"{k} {v:.4g}" for k, v in s["best"]["objectives"].items())
            lines.append(f"  best so far: trial #{s['best']['trial']} ({objs})")
        budget = f" of {s['time_budget_s']:.0f}" if s["time_budget_s"] else ""
        extra = f"  {s['seconds_used']:.0f}{budget} s used"
        if s["median_trial_s"] is not None:
            extra += f", median trial {s['median_trial_s']:.0f} s"
        if s["expected_finish"]:
            extra += f", expected to finish {s['expected_finish']} UTC"
        if s["reason"]:
            extra += f"; {s['reason']}"
        lines.append(extra)
        if s.get("refused_here"):
            lines.append(f"  refused on this host: {s['refused_here']}")
    for g in body.get("gpus") or []:
        what = f"{g['study']} trial #{g['trial']}: {g.get('phase') or ''}" if g.get("study") else "idle"
        lines.append(f"gpu {g['slot']}: {what}")
    if not body["studies"]:
        lines.append("the queue is empty")
    return "\n".join(lines)
