"""`sim`: the simulator's own telemetry (`GET {server_url}/sim/telemetry`), marked simulated.

The twin computes power, energy and memory from its performance model; reading them over HTTP
exercises the same summary, objectives and headroom code a real GPU trial uses, so a study on the
simulator ranks configs by tokens per joule the way a GPU study would. Energy rates use the
simulator's own clock (`time_s`), which runs faster than the wall clock when time_scale > 1.
"""

from __future__ import annotations

from typing import Any, Sequence

import httpx

from autotune.errors import UserError
from autotune.telemetry._gpu import GpuAggregate
from autotune.telemetry._poll import PollingSampler, Probe
from autotune.telemetry.base import Sampler, TelemetrySource, TelemetrySummary, TelemetryTarget

_FIELDS = ("power_w", "energy_mj", "util_pct", "mem_util_pct", "mem_used_mib", "mem_total_mib",
           "sm_clock_mhz", "mem_clock_mhz", "temp_c", "throttle")


class SimProbe(Probe):
    source = "sim"

    def __init__(self, server_url: str, gpus: Sequence[int], timeout_s: float = 0.5,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = server_url.rstrip("/") + "/sim/telemetry"
        self.wanted = set(gpus)
        self.agg = GpuAggregate(list(gpus))
        self._timeout = timeout_s
        self._transport = transport
        self._client: httpx.Client | None = None
        self.failures = 0
        self.last_error: str | None = None

    def open(self) -> None:
        self._client = httpx.Client(timeout=self._timeout, transport=self._transport)

    def read(self, t: float) -> dict[str, Any] | None:
        assert self._client is not None
        try:
            resp = self._client.get(self.url)
            resp.raise_for_status()
            doc = resp.json()
            gpus = doc["gpus"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        readings = [{k: g.get(k) for k in ("index", *_FIELDS)} for g in gpus
                    if not self.wanted or int(g.get("index", 0)) in self.wanted]
        if not self.agg.indices:
            self.agg.indices = sorted(int(r.get("index") or 0) for r in readings)
        clock = doc.get("time_s")
        return self.agg.add(t, readings, clock=None if clock is None else float(clock))

    def summarise(self, s: TelemetrySummary) -> None:
        self.agg.summarise(s)
        s.simulated = True
        if s.samples == 0 or self.agg.stats.count("power_w") == 0:
            s.note = f"simulator telemetry not read ({self.last_error or 'no samples'})"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class SimSource(TelemetrySource):
    name = "sim"

    def sampler(self, target: TelemetryTarget, hz: float = 10.0) -> Sampler:
        if not target.server_url:
            raise UserError("telemetry source 'sim' needs the simulator's URL")
        return PollingSampler(SimProbe(target.server_url, target.gpus), target, hz=hz)
