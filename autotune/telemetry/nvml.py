"""`nvml`: NVIDIA's management library, read directly, over only the trial's GPUs.

Power and the energy counter turn a config's speed into tokens per joule; memory used under load
shows how close a config came to running out (vLLM can pass startup and OOM later); clocks and
clock-event ("throttle") reasons explain a slowdown that flags alone would not. A field a card or
driver refuses (NotSupported, NoPermission, FunctionNotFound) is dropped after the first refusal,
named in the summary, and never asked again, so an old card costs no time per sample for it.
"""

from __future__ import annotations

import types
import warnings
from typing import Any, Callable, Sequence

from autotune.errors import UserError
from autotune.telemetry._gpu import GpuAggregate
from autotune.telemetry._poll import PollingSampler, Probe
from autotune.telemetry.base import Sampler, TelemetrySource, TelemetrySummary, TelemetryTarget

MIB = 1024 * 1024


def import_pynvml() -> types.ModuleType:
    """The NVML binding (package `nvidia-ml-py`, module `pynvml`); tests replace this function."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the deprecated `pynvml` wrapper package warns on import
        import pynvml
    return pynvml


def nvml_unavailable_reason() -> str | None:
    """None when NVML answers and sees at least one GPU, else a short reason for a one-line error."""
    try:
        nv = import_pynvml()
    except ImportError:
        return "the pynvml module (package nvidia-ml-py) is not installed"
    try:
        nv.nvmlInit()
    except Exception as exc:
        return f"NVML did not start ({exc})"
    try:
        if nv.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU"
    finally:
        nv.nvmlShutdown()
    return None


def _readers(nv: types.ModuleType) -> dict[str, Callable[[Any], Any]]:
    """Field -> read function, in the units GpuAggregate expects (W, mJ, %, MiB, MHz, degC, bitmask)."""
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return {
        "power_w": lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "energy_mj": lambda h: float(nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        "util": nv.nvmlDeviceGetUtilizationRates,
        "mem": nv.nvmlDeviceGetMemoryInfo,
        "sm_clock_mhz": lambda h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        "mem_clock_mhz": lambda h: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        "temp_c": lambda h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "throttle": lambda h: int(reasons(h)),
    }


class NvmlProbe(Probe):
    source = "nvml"

    def __init__(self, gpus: Sequence[int]) -> None:
        self.indices = list(gpus)
        self.agg = GpuAggregate(self.indices)
        self._nv: types.ModuleType | None = None
        self._handles: list[tuple[int, Any]] = []
        self._dropped: dict[int, set[str]] = {}
        self._read: dict[str, Callable[[Any], Any]] = {}
        self._permanent: tuple[type[BaseException], ...] = ()
        self._nvml_error: type[BaseException] = Exception

    def open(self) -> None:
        nv = import_pynvml()
        nv.nvmlInit()
        try:
            count = nv.nvmlDeviceGetCount()
            missing = [i for i in self.indices if not 0 <= i < count]
            if missing:
                raise UserError(f"telemetry: GPU {missing[0]} is not present (NVML sees {count} GPU(s))")
            self._handles = [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in self.indices]
        except BaseException:
            nv.nvmlShutdown()
            raise
        self._nv = nv
        self._dropped = {i: set() for i in self.indices}
        self._read = _readers(nv)
        names = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")
        self._permanent = tuple(getattr(nv, n) for n in names if hasattr(nv, n))
        self._nvml_error = getattr(nv, "NVMLError", Exception)

    def _field(self, index: int, handle: Any, name: str) -> Any:
        dropped = self._dropped[index]
        if name in dropped:
            return None
        try:
            return self._read[name](handle)
        except self._permanent:
            dropped.add(name)
        except self._nvml_error:
            pass          # transient (a busy driver): this sample lacks the field
        return None

    def read(self, t: float) -> dict[str, Any] | None:
        readings = []
        for index, h in self._handles:
            r: dict[str, Any] = {"index": index}
            for name in ("power_w", "energy_mj", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "throttle"):
                r[name] = self._field(index, h, name)
            util = self._field(index, h, "util")
            if util is not None:
                r["util_pct"], r["mem_util_pct"] = float(util.gpu), float(util.memory)
            mem = self._field(index, h, "mem")
            if mem is not None:
                r["mem_used_mib"], r["mem_total_mib"] = mem.used / MIB, mem.total / MIB
            readings.append(r)
        return self.agg.add(t, readings)

    def summarise(self, s: TelemetrySummary) -> None:
        self.agg.summarise(s)
        s.unsupported = sorted(f"{name}@gpu{i}" for i, names in self._dropped.items() for name in names)

    def close(self) -> None:
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None


class NvmlSource(TelemetrySource):
    name = "nvml"

    def sampler(self, target: TelemetryTarget, hz: float = 10.0) -> Sampler:
        if not target.gpus:
            raise UserError("telemetry source 'nvml' needs the trial's GPU indices (gpus: [0, ...])")
        return PollingSampler(NvmlProbe(target.gpus), target, hz=hz)
