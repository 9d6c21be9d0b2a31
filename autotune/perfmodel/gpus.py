"""The GPU catalog: the few vendor figures the memory and roofline models need.

`memory_gib` is what the CUDA runtime reports as total (what vLLM multiplies by
--gpu-memory-utilization), not the marketing size: an "80 GB" A100 reports 79.15 GiB, an H200
139.8 GiB (read on the reference H200, REFERENCE.md §2b). Interconnect figures are one direction per
GPU, because an all-reduce ring moves data one way per link step.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import UserError


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float            # total as the CUDA runtime reports it
    hbm_tbps: float              # peak HBM bandwidth, TB/s
    bf16_tflops: float           # dense
    fp8_tflops: float | None     # dense; None: no FP8 tensor cores (Ampere runs FP8 weight-only)
    int8_tops: float
    link_gbps: float             # GPU-to-GPU bandwidth, GB/s one direction (NVLink, else PCIe)
    link_latency_us: float       # small-message collective latency (custom all-reduce, NVLink)
    tdp_w: float
    idle_w: float
    max_sm_mhz: float
    idle_sm_mhz: float
    arch: str                    # ampere | ada | hopper (kernel efficiency differs)
    large_defaults: bool         # vLLM's larger API-server defaults (>= 70 GiB and not named "a100")

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    def peak_flops(self, compute_dtype: str) -> float:
        """FLOP/s of the tensor cores for the matmul dtype actually used."""
        if compute_dtype == "fp8" and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        if compute_dtype == "int8":
            return self.int8_tops * 1e12
        return self.bf16_tflops * 1e12


_CATALOG: dict[str, GPU] = {
    g.name: g
    for g in (
        # A800: A100 silicon with NVLink cut to 400 GB/s both ways (REFERENCE §3).
        GPU("A800", 79.15, 2.039, 312, None, 624, 200, 7, 400, 60, 1410, 210, "ampere", True),
        GPU("A100-80G", 79.15, 2.039, 312, None, 624, 300, 7, 400, 60, 1410, 210, "ampere", False),
        GPU("H100-SXM", 79.11, 3.35, 989, 1979, 1979, 450, 5, 700, 75, 1980, 345, "hopper", True),
        GPU("H200", 139.8, 4.8, 989, 1979, 1979, 450, 5, 700, 79, 1980, 345, "hopper", True),
        GPU("L40S", 44.39, 0.864, 362, 733, 733, 32, 15, 350, 35, 2520, 210, "ada", False),
    )
}
_ALIASES = {"H100": "H100-SXM", "H100SXM": "H100-SXM", "A100": "A100-80G", "A100-80GB": "A100-80G",
            "A800-80G": "A800", "H200-SXM": "H200"}


def gpu_names() -> list[str]:
    return sorted(_CATALOG) + sorted(_ALIASES)


def find_gpu(name: str | None) -> GPU | None:
    """The catalog entry for a name or alias (case-insensitive); None when unknown."""
    if not name:
        return None
    key = name.strip().upper()
    for table in (_CATALOG, _ALIASES):
        for k, v in table.items():
            if k.upper() == key:
                return _CATALOG[v] if isinstance(v, str) else v
    return None


def get_gpu(name: str) -> GPU:
    gpu = find_gpu(name)
    if gpu is None:
        raise UserError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())}")
    return gpu
