"""A stand-in for the `pynvml` module: GPUs whose readings a test or a dry run sets.

Like httpx's mock transport, it sits beside the real thing so tests exercise the real `nvml` source
(field refusal, GPU subsets, shutdown) without a GPU. Install it with
`monkeypatch.setattr(autotune.telemetry.nvml, "import_pynvml", lambda: mock)`.

    >>> nv = MockNvml([MockGpu(power_w=80.0), MockGpu(unsupported={"energy_mj"})])
    >>> nv.nvmlInit(); nv.nvmlDeviceGetCount()
    2
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1024 * 1024
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


@dataclass
class MockGpu:
    """One card. Fields named in `unsupported` raise NotSupported; `read_delay_s` is added per read
    to model a slow driver. Energy advances with `power_w` on the monotonic clock, as NVML's counter
    advances with the card's power."""

    power_w: float = 75.0
    mem_used_mib: float = 600.0
    mem_total_mib: float = 143771.0
    util_pct: float = 0.0
    mem_util_pct: float = 0.0
    sm_clock_mhz: float = 345.0
    mem_clock_mhz: float = 3201.0
    temp_c: float = 30.0
    throttle: int = 0x1
    unsupported: set[str] = field(default_factory=set)
    read_delay_s: float = 0.0
    reads: int = 0
    _energy_mj: float = 1_000_000.0
    _t: float = field(default_factory=time.monotonic)

    def energy(self) -> float:
        now = time.monotonic()
        self._energy_mj += self.power_w * (now - self._t) * 1000.0
        self._t = now
        return self._energy_mj


class MockNvml:
    """Module-like object with the pynvml calls the `nvml` source makes."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, gpus: list[MockGpu]) -> None:
        self.gpus = gpus
        self.inits = 0
        self.shutdowns = 0
        self._lock = threading.Lock()

    # lifecycle -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        with self._lock:
            self.inits += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self.shutdowns >= self.inits:
                raise NVMLError_Uninitialized("shutdown without init")
            self.shutdowns += 1

    @property
    def open_count(self) -> int:
        return self.inits - self.shutdowns

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> MockGpu:
        return self.gpus[i]

    # readings ----------------------------------------------------------------------------------
    def _get(self, g: MockGpu, name: str) -> None:
        if self.open_count <= 0:
            raise NVMLError_Uninitialized("not initialised")
        if g.read_delay_s:
            time.sleep(g.read_delay_s)
        g.reads += 1
        if name in g.unsupported:
            raise NVMLError_NotSupported(name)

    def nvmlDeviceGetPowerUsage(self, g: MockGpu) -> int:
        self._get(g, "power_w")
        return int(g.power_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, g: MockGpu) -> int:
        self._get(g, "energy_mj")
        return int(g.energy())

    def nvmlDeviceGetUtilizationRates(self, g: MockGpu) -> Any:
        self._get(g, "util")
        return SimpleNamespace(gpu=g.util_pct, memory=g.mem_util_pct)

    def nvmlDeviceGetMemoryInfo(self, g: MockGpu) -> Any:
        self._get(g, "mem")
        total, used = int(g.mem_total_mib * MIB), int(g.mem_used_mib * MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetClockInfo(self, g: MockGpu, clock: int) -> int:
        self._get(g, "sm_clock_mhz" if clock == NVML_CLOCK_SM else "mem_clock_mhz")
        return int(g.sm_clock_mhz if clock == NVML_CLOCK_SM else g.mem_clock_mhz)

    def nvmlDeviceGetTemperature(self, g: MockGpu, sensor: int) -> int:
        self._get(g, "temp_c")
        return int(g.temp_c)

    def nvmlDeviceGetCurrentClocksEventReasons(self, g: MockGpu) -> int:
        self._get(g, "throttle")
        return g.throttle
