"""vLLM's own view of a load step, scraped from its Prometheus `/metrics` endpoint.

GPU power says what a config cost; the scheduler's gauges say why it won or lost: a config whose
KV cache ran full and preempted requests at high max-num-seqs reads very differently from one that
idled with an empty queue. The scrape runs in its own thread at a lower rate than the device sampler
so a slow HTTP answer never delays a device sample.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from autotune.telemetry._stats import SeriesBuffer
from autotune.telemetry.base import TelemetrySummary

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

# Names moved between vLLM versions; the first one present wins.
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
# Speculative decoding (vllm/v1/spec_decode/metrics.py): acceptance rate = accepted / draft tokens.
SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total",)
SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition as (name, labels, value); comments and bad lines are skipped."""
    out: list[tuple[str, dict[str, str], float]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, value))
    return out


def _pick(samples: list[tuple[str, dict[str, str], float]], names: tuple[str, ...], how: str) -> float | None:
    """Combine one metric over its label sets (engines, models): `sum` for counts, `max` for fractions."""
    for name in names:
        vals = [v for n, _, v in samples if n == name and not math.isnan(v)]
        if vals:
            return sum(vals) if how == "sum" else max(vals)
    return None


@dataclass
class VllmReading:
    """One scrape, reduced to what a trial summary needs."""

    running: float | None = None
    waiting: float | None = None
    kv_usage_pct: float | None = None
    preemptions_total: float | None = None
    prefix_queries_total: float | None = None
    prefix_hits_total: float | None = None
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_total: float | None = None

    @classmethod
    def from_text(cls, text: str) -> "VllmReading":
        s = parse_prometheus(text)
        kv = _pick(s, KV_USAGE, "max")
        return cls(
            running=_pick(s, RUNNING, "sum"),
            waiting=_pick(s, WAITING, "sum"),
            kv_usage_pct=None if kv is None else kv * 100.0,   # vLLM exports a 0..1 fraction
            preemptions_total=_pick(s, PREEMPTIONS, "sum"),
            prefix_queries_total=_pick(s, PREFIX_QUERIES, "sum"),
            prefix_hits_total=_pick(s, PREFIX_HITS, "sum"),
            spec_drafts_total=_pick(s, SPEC_DRAFTS, "sum"),
            spec_draft_tokens_total=_pick(s, SPEC_DRAFT_TOKENS, "sum"),
            spec_accepted_total=_pick(s, SPEC_ACCEPTED, "sum"),
        )


def spec_decode_stats(before: VllmReading | None, after: VllmReading | None) -> dict[str, float]:
    """Speculative decoding between two readings: `spec_acceptance_pct` (accepted / proposed draft
    tokens) and `spec_mean_accepted` (tokens accepted per draft); empty when the server proposed none."""
    if before is None or after is None:
        return {}
    drafted = _delta(before.spec_draft_tokens_total, after.spec_draft_tokens_total)
    accepted = _delta(before.spec_accepted_total, after.spec_accepted_total)
    drafts = _delta(before.spec_drafts_total, after.spec_drafts_total)
    if not drafted or accepted is None:
        return {}
    out = {"spec_acceptance_pct": 100.0 * accepted / drafted, "spec_draft_tokens": drafted}
    if drafts:
        out["spec_mean_accepted"] = accepted / drafts
    return out


def _delta(first: float | None, last: float | None) -> float | None:
    """Counter increase over the window; a counter that went down was reset (server restart)."""
    if first is None or last is None:
        return None
    return last - first if last >= first else last


@dataclass
class _Window:
    first: VllmReading | None = None
    last: VllmReading | None = None
    peak: dict[str, float] = field(default_factory=dict)
    scrapes: int = 0
    errors: int = 0

    def add(self, r: VllmReading) -> None:
        if self.first is None:
            self.first = r
        self.last = r
        self.scrapes += 1
        for key in ("running", "waiting", "kv_usage_pct"):
            v = getattr(r, key)
            if v is not None:
                self.peak[key] = max(self.peak.get(key, v), v)


class MetricsScraper:
    """Polls `{server_url}/metrics` in a background thread and fills the vLLM fields of a summary."""

    # A busy server answers /metrics late (its event loop is streaming tokens); a short timeout would
    # drop exactly the scrapes taken under load and leave only the idle ones (seen on the CPU build).
    def __init__(self, server_url: str, hz: float = 2.0, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None, series_capacity: int = 1024) -> None:
        self.url = server_url.rstrip("/") + "/metrics"
        self.period = 1.0 / hz if hz > 0 else 0.5
        self._client = httpx.Client(timeout=timeout_s, transport=transport)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self.window = _Window()
        self.series = SeriesBuffer(series_capacity)

    def scrape_once(self) -> VllmReading | None:
        try:
            resp = self._client.get(self.url)
            resp.raise_for_status()
        except httpx.HTTPError:
            self.window.errors += 1
            return None
        reading = VllmReading.from_text(resp.text)
        self.window.add(reading)
        row: dict[str, Any] = {"t": round(time.monotonic() - self._t0, 3)}
        for key in ("running", "waiting", "kv_usage_pct"):
            v = getattr(reading, key)
            if v is not None:
                row[key] = round(v, 3)
        if reading.preemptions_total is not None:
            row["preemptions_total"] = reading.preemptions_total
        self.series.append(row)
        return reading

    def start(self, t0: float | None = None) -> None:
        self._t0 = time.monotonic() if t0 is None else t0
        self._thread = threading.Thread(target=self._run, name="autotune-metrics-scrape", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def stop(self) -> None:
        """Join the thread, then scrape once more so counters' deltas end at the window's end."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.scrape_once()
        self._client.close()

    def fill(self, summary: TelemetrySummary) -> None:
        w = self.window
        if w.first is None or w.last is None:
            return
        summary.max_running = w.peak.get("running")
        summary.max_waiting = w.peak.get("waiting")
        summary.peak_kv_usage_pct = w.peak.get("kv_usage_pct")
        summary.preemptions = _delta(w.first.preemptions_total, w.last.preemptions_total)
        queries = _delta(w.first.prefix_queries_total, w.last.prefix_queries_total)
        hits = _delta(w.first.prefix_hits_total, w.last.prefix_hits_total)
        if queries and hits is not None:
            summary.prefix_cache_hit_rate = hits / queries
