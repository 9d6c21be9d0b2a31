"""What a load run yields. Keys of `Measurement.metrics` follow `vllm bench serve`'s result JSON
(`output_throughput`, `request_throughput`, `total_token_throughput`, `mean_ttft_ms`, `median_ttft_ms`,
`std_ttft_ms`, `p90_ttft_ms`, `p95_ttft_ms`, `p99_ttft_ms`, `p99.9_ttft_ms`, likewise for tpot, itl and
e2el, `completed`, `failed`, `total_input_tokens`, `total_output_tokens`, `duration`,
`max_concurrent_requests`) plus autotune's own `goodput` (req/s meeting every SLO term),
`slo_attainment_pct`, `request_rate` (offered) and `concurrency` (offered); open loops add the send-time
drift (`mean_send_drift_ms`, `median_send_drift_ms`, `p99_send_drift_ms`, `max_send_drift_ms`: how late
requests went out against their schedule) and `median_send_gap_ms` (the schedule's median gap between
consecutive requests, to judge the drift against)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """One request, timed with a monotonic clock at chunk arrival. Failed requests stay in the list."""

    start_s: float
    ttft_ms: float | None
    e2el_ms: float | None
    itl_ms: list[float]
    input_tokens: int
    output_tokens: int
    ok: bool
    error: str | None = None
    scheduled_s: float | None = None   # open loop: when the request was due (same clock as start_s)
    images: int = 0                    # images the request carried (its class: slo.request_class)

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first; None where it was not measured: one token, or every
        token read at the same instant (a server or client that fell behind delivers a whole answer in
        one read, and 0 ms would be reported as the fastest decoding ever seen)."""
        if not self.ok or self.output_tokens <= 1 or self.ttft_ms is None or self.e2el_ms is None:
            return None
        if self.e2el_ms <= self.ttft_ms:
            return None
        return (self.e2el_ms - self.ttft_ms) / (self.output_tokens - 1)


@dataclass
class ClientHealth:
    """Whether the load generator itself kept up (event-loop lag, CPU); saturated results are not trusted."""

    saturated: bool = False
    loop_lag_p99_ms: float | None = None
    cpu_pct: float | None = None
    note: str = ""


@dataclass
class Measurement:
    metrics: dict[str, float]
    records: list[RequestRecord] = field(default_factory=list)
    client: ClientHealth = field(default_factory=ClientHealth)
    load: dict[str, Any] = field(default_factory=dict)   # what was offered: mode, concurrency/rate, n, seed
    aborted_early: bool = False
    first_wave: list[RequestRecord] = field(default_factory=list)   # sent under load, kept out of the figures
    flags: list[str] = field(default_factory=list)   # measurement flags (DESIGN.md): figures not to trust alone

    def first_wave_summary(self) -> dict[str, Any] | None:
        """The synchronized first burst, reported apart from the figures it was kept out of."""
        if not self.first_wave:
            return None
        from autotune.bench.metrics import summarize
        x = summarize(self.first_wave, 1.0)
        return {"requests": len(self.first_wave), "failed": int(x["failed"]),
                **{k: x[k] for k in ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms") if k in x}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Measurement":
        """The inverse of `dataclasses.asdict(m)`: how a measurement comes back from the worker process
        that took it (tuner/measure.py), request records included."""
        return cls(metrics=dict(data["metrics"]), records=[RequestRecord(**r) for r in data.get("records", [])],
                   client=ClientHealth(**data.get("client", {})), load=dict(data.get("load", {})),
                   aborted_early=bool(data.get("aborted_early")),
                   first_wave=[RequestRecord(**r) for r in data.get("first_wave", [])],
                   flags=list(data.get("flags", [])))

    def to_json(self, with_records: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {**self.metrics, "load": self.load, "client": asdict(self.client),
                               "aborted_early": self.aborted_early, "measurement_flags": list(self.flags),
                               "first_wave": self.first_wave_summary()}
        if with_records:
            out["requests"] = [stored_record(r) for r in self.records]
        return out


US_MS, US_S = 3, 6   # decimals of a microsecond in milliseconds and in seconds


def stored_record(r: RequestRecord) -> dict[str, Any]:
    """A request as JSON, its times to the microsecond. The client's clock says nothing finer, and the
    full digits of every inter-token gap made one decode-heavy trial's requests 7.0 MB in the study DB
    (686 requests of 512 tokens at 343 streams, on an H100): 2.9 MB in this form, 0.8 MB gzipped against 2.6."""
    d = asdict(r)
    d["itl_ms"] = [round(x, US_MS) for x in r.itl_ms]
    for k in ("ttft_ms", "e2el_ms"):
        if d[k] is not None:
            d[k] = round(d[k], US_MS)
    for k in ("start_s", "scheduled_s"):
        if d[k] is not None:
            d[k] = round(d[k], US_S)
    return d


@dataclass
class LoadStep:
    """One step of a capacity search: the offered load and what it gave."""

    load: float                # request rate (req/s) or concurrency, by the search's mode
    measurement: Measurement
    slo_met: bool
    # Why each run of this step did not measure the configuration alone (a kernel JIT-compiled during
    # it): [] clean; one reason: the first run was discarded (kept as `discarded`) and its re-run is
    # `measurement`; two: the re-run was disturbed too and is kept, flagged `jit_compile`.
    disturbances: list[str] = field(default_factory=list)
    discarded: Measurement | None = None


@dataclass
class CapacityResult:
    """Highest load that met the SLO. `at_capacity` is None when even the lowest load broke it."""

    mode: str                  # "rate" or "concurrency"
    capacity: float | None
    at_capacity: Measurement | None
    steps: list[LoadStep] = field(default_factory=list)
    cache_reset: bool = True   # False when the server had no /reset_prefix_cache (404)
    note: str = ""             # caveats a person should read beside the number (client saturated, ...)
    bracket: tuple[float | None, float | None] = (None, None)   # (highest load met, lowest load broken)
    flags: list[str] = field(default_factory=list)   # measurement flags: client_saturated, prefix_hits, wide_bracket, jit_compile

    def to_json(self, with_records: bool = False) -> dict[str, Any]:
        # Each step's numeric `load` is the step's own; what the measurement offered (its load record)
        # is kept under `offered`, so the one never overwrites the other.
        steps = []
        for s in self.steps:
            body = s.measurement.to_json(with_records=False)
            body["offered"] = body.pop("load")
            steps.append({**body, "load": s.load, "slo_met": s.slo_met, "disturbances": list(s.disturbances)})
        return {"mode": self.mode, "capacity": self.capacity, "bracket": list(self.bracket),
                "measurement_flags": list(self.flags), "cache_reset": self.cache_reset, "note": self.note,
                "steps": steps,
                "at_capacity": None if self.at_capacity is None else self.at_capacity.to_json(with_records)}
