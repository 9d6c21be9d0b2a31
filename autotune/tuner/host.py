"""The hardware stamp on every trial: results from one machine must not be mistaken for another's."""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil

from autotune.spec import StudySpec


def nvml_gpus() -> list[dict[str, Any]]:
    """Name and memory of each visible NVIDIA GPU; empty where NVML is absent (the CPU build)."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                        "memory_mib": round(mem.total / 2**20)})
        return out
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def catalog_gpu_name(nvml_name: str) -> str | None:
    """NVML's marketing name ("NVIDIA H100 80GB HBM3", "NVIDIA A800-SXM4-80GB") -> the simulator
    catalog's name, so the memory model can judge real candidates too; None when not in the catalog."""
    upper = nvml_name.upper()
    if "40GB" in upper:
        return None  # the catalog's A100 is the 80 GB part
    for key in ("H200", "H100", "A800", "A100", "L40S"):
        if key in upper:
            return {"H100": "H100-SXM", "A100": "A100-80G"}.get(key, key)
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(spec: StudySpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
    }
    if spec.engine.kind == "sim":
        out["simulated_gpu"] = spec.engine.gpu
        out["simulated_num_gpus"] = spec.engine.num_gpus
    else:
        gpus = nvml_gpus()
        out["gpus"] = [g for g in gpus if not spec.gpus or g["index"] in spec.gpus]
    return out
