"""The daemon's `/metrics` in Prometheus' text format: trials by state and cause, seconds each GPU
slot was busy, and a histogram of trial wall times. Trials are counted from the database (all hosts
of a shared study); busy seconds are this daemon's own, since it started (a Prometheus counter)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Iterable, Mapping, Sequence

from autotune.store.models import TrialRecord

DURATION_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 1200.0, 3600.0)


class BusyClock:
    """Seconds each slot held a trial: `update()` with the busy slots at every poll (thread-safe)."""

    def __init__(self, slots: Iterable[int]) -> None:
        self._total = {s: 0.0 for s in slots}
        self._since: dict[int, float] = {}
        self._lock = threading.Lock()

    def update(self, busy: Iterable[int], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        busy = set(busy)
        with self._lock:
            for s in busy - set(self._since):
                self._since[s] = now
            for s in set(self._since) - busy:
                self._total[s] = self._total.get(s, 0.0) + now - self._since.pop(s)

    def seconds(self, now: float | None = None) -> dict[int, float]:
        now = time.monotonic() if now is None else now
        with self._lock:
            out = dict(self._total)
            for s, t0 in self._since.items():
                out[s] = out.get(s, 0.0) + now - t0
            return out


def _labels(**kv: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def prometheus(trials: Mapping[str, Sequence[TrialRecord]], busy_s: Mapping[int, float], *, host: str,
               queue_states: Mapping[str, int], draining: bool) -> str:
    out = ["# HELP autotune_trials Trials in the study database, by study, state and failure cause.",
           "# TYPE autotune_trials gauge"]
    for study, recs in sorted(trials.items()):
        counts = Counter((t.state, t.cause or "") for t in recs)
        for (state, cause), n in sorted(counts.items()):
            out.append(f"autotune_trials{_labels(study=study, state=state, cause=cause)} {n}")
    out += ["# HELP autotune_gpu_busy_seconds_total Seconds each GPU slot of this daemon held a trial.",
            "# TYPE autotune_gpu_busy_seconds_total counter"]
    for slot, s in sorted(busy_s.items()):
        out.append(f"autotune_gpu_busy_seconds_total{_labels(host=host, gpu=slot)} {s:.3f}")
    out += ["# HELP autotune_trial_duration_seconds Wall time of finished trials, start to end.",
            "# TYPE autotune_trial_duration_seconds histogram"]
    for study, recs in sorted(trials.items()):
        walls = [(t.finished_at - t.started_at).total_seconds() for t in recs
                 if t.finished_at is not None and t.started_at is not None and t.state != "running"]
        for le in DURATION_BUCKETS:
            out.append(f"autotune_trial_duration_seconds_bucket{_labels(study=study, le=f'{le:g}')} "
                       f"{sum(w <= le for w in walls)}")
        out.append(f"autotune_trial_duration_seconds_bucket{_labels(study=study, le='+Inf')} {len(walls)}")
        out.append(f"autotune_trial_duration_seconds_sum{_labels(study=study)} {sum(walls):.3f}")
        out.append(f"autotune_trial_duration_seconds_count{_labels(study=study)} {len(walls)}")
    out += ["# HELP autotune_queue_studies Studies in the queue by state.", "# TYPE autotune_queue_studies gauge"]
    for state, n in sorted(queue_states.items()):
        out.append(f"autotune_queue_studies{_labels(state=state)} {n}")
    out += ["# HELP autotune_daemon_draining 1 while the daemon drains after SIGTERM.",
            "# TYPE autotune_daemon_draining gauge", f"autotune_daemon_draining{_labels(host=host)} {int(draining)}"]
    return "\n".join(out) + "\n"
