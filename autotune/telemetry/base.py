"""The telemetry interface: a background sampler over only the trial's devices or process tree.

Sources (`nvml`, `cpu`, `sim`, `none`) each live in their own module beside this one and are looked
up by name through `autotune.telemetry.get_source`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class TelemetryTarget:
    """What to watch: the server's root PID (its whole tree for `cpu`), the GPU indices it was given,
    and its base URL (for `/metrics` and the simulator's telemetry)."""

    server_pid: int | None = None
    gpus: Sequence[int] = ()
    server_url: str | None = None


@dataclass
class TelemetrySummary:
    """Per-trial summary. Fields a source cannot read stay None; `source` says which source it was
    (`none` means nothing was measured). `series` holds the raw samples (kept for the best trials)."""

    source: str
    samples: int = 0
    duration_s: float = 0.0
    mean_power_w: float | None = None
    max_power_w: float | None = None
    energy_j: float | None = None
    peak_mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    mean_util_pct: float | None = None
    mean_mem_util_pct: float | None = None
    max_temp_c: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    cpu_pct_mean: float | None = None
    rss_peak_mib: float | None = None
    peak_kv_usage_pct: float | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = None
    max_running: float | None = None
    max_waiting: float | None = None
    overhead_ms_per_sample: float | None = None
    series: list[dict[str, Any]] = field(default_factory=list)
    # Added by the telemetry package (additive; all optional):
    gpus: list[int] = field(default_factory=list)        # device indices watched (nvml/sim)
    simulated: bool = False                              # values come from the simulator, not hardware
    energy_method: str | None = None                     # "counter" (NVML/sim mJ counter) | "power_integral"
    energy_window_s: float | None = None                 # time the energy was counted over (source's clock)
    joules_per_token: float | None = None                # set by `objectives()` once tokens are known
    unsupported: list[str] = field(default_factory=list)  # fields the source could not read
    note: str | None = None                              # why nothing (or less) was measured

    @property
    def mem_headroom(self) -> float | None:
        """Peak free memory fraction under load (objective `mem_headroom`)."""
        if self.peak_mem_used_mib is None or not self.mem_total_mib:
            return None
        return max(0.0, 1.0 - self.peak_mem_used_mib / self.mem_total_mib)


class Sampler(ABC):
    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> TelemetrySummary:
        """Stop the background thread and summarise; safe to call twice."""


class TelemetrySource(ABC):
    name: str

    @abstractmethod
    def sampler(self, target: TelemetryTarget, hz: float = 10.0) -> Sampler: ...
