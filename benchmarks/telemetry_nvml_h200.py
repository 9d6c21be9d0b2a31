"""A real reading of the `nvml` telemetry source under a known GPU load, and what 10 Hz sampling costs.

Timeline (sampler at --hz on GPU 0 throughout): idle, then a bf16 matmul loop holding a large
buffer, then idle again with the buffer freed. Then the overhead: time per sample over many direct
reads, and matmul throughput in alternating blocks with and without a sampler running.
Writes one JSON (the fixture tests/fixtures/telemetry_nvml_h200.json is a copy of it).

    # on the H200 (device): PYTHONPATH=$PWD python3 benchmarks/telemetry_nvml_h200.py --out $OUT/telemetry_nvml_h200.json
    # dry run on a CPU host, NVML and the GPU load replaced by autotune.telemetry.mock_nvml:
    PYTHONPATH=$PWD .venv/bin/python benchmarks/telemetry_nvml_h200.py --mock --idle 0.5 --load 1 --ab-block 0.3 --out /tmp/t.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from typing import Any

import autotune.telemetry.nvml as nvml_mod
from autotune.telemetry import TelemetryTarget, summary_for_store
from autotune.telemetry.nvml import NvmlProbe, NvmlSource

GIB = 1024 ** 3


class TorchLoad:
    """bf16 8192^3 matmuls on cuda:0 beside a large held buffer."""

    def __init__(self, n: int = 8192) -> None:
        import torch
        self.torch = torch
        torch.cuda.init()
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.c = self.a @ self.b           # cuBLAS workspace and context exist before the idle phase
        torch.cuda.synchronize()
        self.flop = 2.0 * n ** 3
        self.buf = None

    def info(self) -> dict[str, Any]:
        return {"torch": self.torch.__version__, "device_name": self.torch.cuda.get_device_name(0)}

    def allocated(self) -> dict[str, float]:
        t = self.torch.cuda
        return {"torch_allocated_mib": t.memory_allocated() / 2**20, "torch_reserved_mib": t.memory_reserved() / 2**20}

    def hold(self, gib: float) -> None:
        self.buf = self.torch.empty(int(gib * GIB), dtype=self.torch.uint8, device="cuda")
        self.buf.fill_(1)
        self.torch.cuda.synchronize()

    def release(self) -> None:
        self.buf = None
        self.torch.cuda.empty_cache()
        self.torch.cuda.synchronize()

    def run(self, seconds: float) -> float:
        """Matmuls for `seconds`; returns TFLOP/s."""
        torch, done, t0 = self.torch, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                torch.matmul(self.a, self.b, out=self.c)
            torch.cuda.synchronize()
            done += 20
        return done * self.flop / (time.perf_counter() - t0) / 1e12


class MockLoad:
    """CPU stand-in for a dry run: drives a MockGpu's readings the way the real load would."""

    def __init__(self) -> None:
        from autotune.telemetry.mock_nvml import MockGpu, MockNvml
        self.gpu = MockGpu(power_w=79.0, mem_used_mib=615.0, read_delay_s=0.0005)
        nvml_mod.import_pynvml = lambda: MockNvml([self.gpu])   # type: ignore[assignment]
        self.held = 0.0

    def info(self) -> dict[str, Any]:
        return {"torch": None, "device_name": "mock"}

    def allocated(self) -> dict[str, float]:
        return {"torch_allocated_mib": self.held * 1024, "torch_reserved_mib": self.held * 1024}

    def hold(self, gib: float) -> None:
        self.held = gib
        self.gpu.mem_used_mib += gib * 1024
        self.gpu.power_w, self.gpu.util_pct, self.gpu.throttle = 690.0, 99.0, 0x4

    def release(self) -> None:
        self.gpu.mem_used_mib -= self.held * 1024
        self.held = 0.0
        self.gpu.power_w, self.gpu.util_pct, self.gpu.throttle = 79.0, 0.0, 0x1

    def run(self, seconds: float) -> float:
        time.sleep(seconds)
        return 1.0


def phase_stats(series: list[dict[str, Any]], lo: float, hi: float) -> dict[str, Any]:
    rows = [r for r in series if lo <= r["t"] < hi]
    out: dict[str, Any] = {"from_s": round(lo, 3), "to_s": round(hi, 3), "samples": len(rows)}
    for key in ("power_w", "util_pct", "mem_used_mib", "sm_clock_mhz", "temp_c"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[f"mean_{key}"] = round(statistics.fmean(vals), 2)
            out[f"max_{key}"] = round(max(vals), 2)
    e = [r for r in rows if "energy_j" in r]
    if len(e) >= 2 and e[-1]["t"] > e[0]["t"]:
        out["counter_power_w"] = round((e[-1]["energy_j"] - e[0]["energy_j"]) / (e[-1]["t"] - e[0]["t"]), 2)
    return out


def read_cost(reads: int) -> dict[str, float]:
    """Time of one full sample (every field of GPU 0), read back to back."""
    probe = NvmlProbe([0])
    probe.open()
    try:
        took = []
        for i in range(reads):
            t = time.perf_counter()
            probe.read(float(i))
            took.append((time.perf_counter() - t) * 1000.0)
    finally:
        probe.close()
    took.sort()
    return {"reads": reads, "p50_ms": round(took[len(took) // 2], 3),
            "p99_ms": round(took[int(len(took) * 0.99) - 1], 3), "mean_ms": round(statistics.fmean(took), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--load", type=float, default=15.0)
    ap.add_argument("--hold-gib", type=float, default=20.0)
    ap.add_argument("--ab-block", type=float, default=2.5, help="seconds per throughput block (4 on, 4 off)")
    ap.add_argument("--mock", action="store_true", help="dry run on CPU with autotune.telemetry.mock_nvml")
    a = ap.parse_args()

    load = MockLoad() if a.mock else TorchLoad()
    nv = nvml_mod.import_pynvml()
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "hz": a.hz, "mock": a.mock,
            "nvml_name": str(nv.nvmlDeviceGetName(h)) if hasattr(nv, "nvmlDeviceGetName") else None,
            "driver": str(nv.nvmlSystemGetDriverVersion()) if hasattr(nv, "nvmlSystemGetDriverVersion") else None,
            "power_limit_w": (nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
                              if hasattr(nv, "nvmlDeviceGetEnforcedPowerLimit") else None),
            "hold_gib": a.hold_gib, **load.info()}
    nv.nvmlShutdown()

    sampler = NvmlSource().sampler(TelemetryTarget(gpus=[0]), hz=a.hz)
    sampler.start()
    t0 = sampler.started_at
    time.sleep(a.idle)
    t_load = time.monotonic() - t0
    before = load.allocated()
    load.hold(a.hold_gib)
    held = load.allocated()
    tflops = load.run(a.load)
    t_load_end = time.monotonic() - t0
    load.release()
    time.sleep(a.idle)
    summary = sampler.stop()

    blocks: dict[str, list[float]] = {"with_sampler": [], "without_sampler": []}
    ab_overhead = []
    for _ in range(4):
        blocks["without_sampler"].append(load.run(a.ab_block))
        s = NvmlSource().sampler(TelemetryTarget(gpus=[0]), hz=a.hz)
        s.start()
        blocks["with_sampler"].append(load.run(a.ab_block))
        ab_overhead.append(s.stop().overhead_ms_per_sample)
    on, off = statistics.fmean(blocks["with_sampler"]), statistics.fmean(blocks["without_sampler"])

    series = summary.series
    settle = min(1.0, a.load / 4, a.idle / 2)      # time for clocks and power to follow the load
    result = {
        "meta": meta,
        "phases": {
            "idle_before": phase_stats(series, 0.0, t_load),
            "load": phase_stats(series, t_load + settle, t_load_end),
            "idle_after": phase_stats(series, t_load_end + settle, summary.duration_s + 1.0),
        },
        "memory": {"before_hold": before, "holding": held,
                   "allocated_by_load_mib": round(held["torch_reserved_mib"] - before["torch_reserved_mib"], 1)},
        "load_tflops": round(tflops, 1),
        "overhead": {
            "ms_per_sample_during_run": summary.overhead_ms_per_sample,
            "ms_per_sample_ab_blocks": ab_overhead,
            "direct_reads": read_cost(200),
            "core_fraction_at_hz": round((summary.overhead_ms_per_sample or 0.0) * a.hz / 1000.0, 4),
            "tflops_blocks": {k: [round(v, 1) for v in vs] for k, vs in blocks.items()},
            "tflops_with_sampler": round(on, 1), "tflops_without_sampler": round(off, 1),
            "throughput_change_pct": round(100.0 * (on - off) / off, 2),
        },
        "summary": summary_for_store(summary),
        "series": series,
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("phases", "memory", "load_tflops", "overhead")}, indent=1))


if __name__ == "__main__":
    main()
