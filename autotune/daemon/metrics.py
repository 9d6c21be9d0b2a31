"""The daemon's `/metrics`, served through `prometheus-client` (the library every scraper expects): one
`CollectorRegistry` per daemon with one collector that reads, at each scrape, the trials of the studies
in the queue (from the database: every host of a shared study), this daemon's slots and the jobs it runs.

Series: `autotune_trials{study,state,cause}`, `autotune_gpu_busy_seconds_total{host,gpu}` (seconds each
slot of this daemon held a job, since it started), `autotune_slot_busy_ratio{host,gpu}` (the same over
the daemon's uptime), `autotune_trial_duration_seconds{study}` (histogram of finished trials' wall
times), `autotune_trial_client_cpu_seconds{study}` and `autotune_trial_client_cpu_share{study}`
(histograms of each measured trial's load client: its worker process's CPU seconds, and those over the
measurement's wall time, of one core), `autotune_running_jobs{host}`, `autotune_queue_studies{state}`,
`autotune_daemon_draining{host}`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


DURATION_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 1200.0, 3600.0)
CPU_SECONDS_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CPU_SHARE_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


class BusyClock:
    """Seconds each slot held a job: `update()` with the busy slots at every poll (thread-safe)."""

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


@dataclass
class Reading:
    """What one scrape reports (DaemonCollector asks for a fresh one each time)."""

    trials: Mapping[str, Sequence[Any]]             # study -> its trials (all hosts): store.trial_times rows
    busy_s: Mapping[int, float]                     # slot -> busy seconds of this daemon
    host: str
    queue_states: Mapping[str, int] = field(default_factory=dict)
    draining: bool = False
    uptime_s: float | None = None                   # seconds since the daemon started (the ratio's base)
    running: int = 0                                # jobs running here now


def _histogram(name: str, doc: str, values: Mapping[str, list[float]], buckets: Sequence[float]) -> Metric:
    h = HistogramMetricFamily(name, doc, labels=["study"])
    for study, xs in sorted(values.items()):
        counts = [(floatToGoString(le), float(sum(x <= le for x in xs))) for le in buckets]
        h.add_metric([study], counts + [("+Inf", float(len(xs)))], sum_value=sum(xs))
    return h


def families(r: Reading) -> Iterator[Metric]:
    """The metric families of one reading."""
    trials = GaugeMetricFamily("autotune_trials", "Trials in the study database, by study, state and failure cause.",
                               labels=["study", "state", "cause"])
    walls: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    share: dict[str, list[float]] = {}
    for study, recs in sorted(r.trials.items()):
        for (state, cause), n in sorted(Counter((t.state, t.cause or "") for t in recs).items()):
            trials.add_metric([study, state, cause], n)
        walls[study] = [(t.finished_at - t.started_at).total_seconds() for t in recs
                        if t.finished_at is not None and t.started_at is not None and t.state != "running"]
        used = [t.client for t in recs if getattr(t, "client", None)]
        cpu[study] = [float(c["cpu_s"]) for c in used if c.get("cpu_s") is not None]
        share[study] = [float(c["cpu_share"]) for c in used if c.get("cpu_share") is not None]
    yield trials
    busy = CounterMetricFamily("autotune_gpu_busy_seconds", "Seconds each GPU slot of this daemon held a job.",
                               labels=["host", "gpu"])
    ratio = GaugeMetricFamily("autotune_slot_busy_ratio", "Busy seconds of each slot over the daemon's uptime.",
                              labels=["host", "gpu"])
    for slot, s in sorted(r.busy_s.items()):
        busy.add_metric([r.host, str(slot)], s)
        if r.uptime_s:
            ratio.add_metric([r.host, str(slot)], min(1.0, s / r.uptime_s))
    yield busy
    yield ratio
    yield _histogram("autotune_trial_duration_seconds", "Wall time of finished trials, start to end.", walls,
                     DURATION_BUCKETS)
    yield _histogram("autotune_trial_client_cpu_seconds", "CPU seconds of each measured trial's load client "
                     "(its worker process).", cpu, CPU_SECONDS_BUCKETS)
    yield _histogram("autotune_trial_client_cpu_share", "Each measured trial's load client: CPU seconds over the "
                     "measurement's wall seconds, of one core.", share, CPU_SHARE_BUCKETS)
    running = GaugeMetricFamily("autotune_running_jobs", "Jobs (trials, confirmation rounds) running here.",
                                labels=["host"])
    running.add_metric([r.host], r.running)
    yield running
    queue = GaugeMetricFamily("autotune_queue_studies", "Studies in the queue by state.", labels=["state"])
    for state, n in sorted(r.queue_states.items()):
        queue.add_metric([state], n)
    yield queue
    draining = GaugeMetricFamily("autotune_daemon_draining", "1 while the daemon drains after SIGTERM.",
                                 labels=["host"])
    draining.add_metric([r.host], int(r.draining))
    yield draining


class DaemonCollector(Collector):
    """Reads a fresh `Reading` at every scrape."""

    def __init__(self, read: Callable[[], Reading]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        yield from families(self.read())


def registry_for(read: Callable[[], Reading]) -> CollectorRegistry:
    """The daemon's own registry (not the process-global one: two daemons in one test process, or a
    library user's own metrics, never mix)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(read))
    return registry


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()
