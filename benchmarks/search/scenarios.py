"""The search benchmark's scenarios: a model, GPUs, workload, SLO, a search space and ONE stated
discretization of it. Every landscape value is the in-process twin (autotune.sim.inprocess), labelled
simulated; nothing here is a GPU measurement."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LLAMA8B = str(ROOT / "benchmarks" / "gpu" / "llama8b-shaped-config.json")


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    gpu: str
    num_gpus: int
    fixed_flags: tuple[str, ...]
    input_len: int
    output_len: int
    slo: str
    space: dict[str, Any]                      # a search-space mapping (as search_spaces/*.yaml)
    grid: dict[str, tuple[Any, ...]]           # the discretization: values per searched param
    held_gib: float = 0.0                      # memory another process holds on the card (startup_oom above it)
    requests_per_step: int = 160
    notes: str = ""
    moe: bool = False

    def points(self) -> list[dict[str, Any]]:
        names = list(self.grid)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.grid[n] for n in names))]


DENSE_PARAMS = {
    "gpu_memory_utilization": {"type": "float", "low": 0.80, "high": 0.97, "step": 0.01, "default": 0.92},
    "max_num_seqs": {"type": "int", "low": 16, "high": 1024, "log": True, "default": 1024},
    "max_num_batched_tokens": {"type": "int", "low": 1024, "high": 32768, "log": True, "default": 8192},
    "enable_chunked_prefill": {"type": "bool", "default": True},
    "enable_prefix_caching": {"type": "bool", "default": True},
}
DENSE_GRID = {
    "gpu_memory_utilization": (0.80, 0.90, 0.97),
    "max_num_seqs": (16, 32, 64, 128, 256, 512, 1024),
    "max_num_batched_tokens": (1024, 2048, 4096, 8192, 16384, 32768),
    "enable_chunked_prefill": (True, False),
    "enable_prefix_caching": (True, False),
}
MOE_LAYOUTS = {"tp2": {"tensor_parallel_size": 2}, "tp4": {"tensor_parallel_size": 4},
               "tp8": {"tensor_parallel_size": 8}, "tp4-dp2": {"tensor_parallel_size": 4, "data_parallel_size": 2},
               "tp2-ep": {"tensor_parallel_size": 2, "enable_expert_parallel": True},
               "tp4-ep": {"tensor_parallel_size": 4, "enable_expert_parallel": True},
               "tp8-ep": {"tensor_parallel_size": 8, "enable_expert_parallel": True},
               "tp4-dp2-ep": {"tensor_parallel_size": 4, "data_parallel_size": 2, "enable_expert_parallel": True}}

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario(
        name="dense-1gpu", model=LLAMA8B, gpu="H200", num_gpus=1, fixed_flags=("--max-model-len", "4096"),
        input_len=1024, output_len=128, slo="ttft:p99<=1s",
        space={"params": DENSE_PARAMS}, grid=DENSE_GRID, held_gib=6.0,
        notes="the H200 study's model shape, workload and SLO; another process holds 6 GiB of the card, "
              "so a memory fraction above (139.8 - 6) / 139.8 = 0.957 fails at startup with vLLM's "
              "free-memory line (the memory model does not know about the other process)"),
    Scenario(
        name="moe-8gpu", model="glm-4.6v-106b", gpu="H100", num_gpus=8,
        fixed_flags=("--max-model-len", "8192", "--quantization", "fp8"),
        input_len=1024, output_len=128, slo="ttft:p99<=1s", moe=True,
        space={"params": {
            "max_num_seqs": {"type": "int", "low": 32, "high": 512, "log": True, "default": 256},
            "max_num_batched_tokens": {"type": "int", "low": 2048, "high": 32768, "log": True, "default": 8192},
            "enable_chunked_prefill": {"type": "bool", "default": True},
            "parallel_layout": {"type": "categorical", "default": "tp8", "choices": MOE_LAYOUTS}}},
        grid={"max_num_seqs": (32, 64, 128, 256, 512), "max_num_batched_tokens": (2048, 8192, 32768),
              "enable_chunked_prefill": (True, False), "parallel_layout": tuple(MOE_LAYOUTS)},
        notes="106B MoE (GLM-4.5-Air shape) with FP8 weights on 8 x H100; memory fraction fixed at vLLM's "
              "0.92 and prefix caching on (random prompts never hit it)"),
    Scenario(
        name="long-prompt", model=LLAMA8B, gpu="H200", num_gpus=1, fixed_flags=("--max-model-len", "8192"),
        input_len=6144, output_len=128, slo="ttft:p99<=3s",
        space={"params": {k: v for k, v in DENSE_PARAMS.items()}},
        grid={**DENSE_GRID, "max_num_seqs": (16, 32, 64, 128, 256, 1024),
              "max_num_batched_tokens": (2048, 4096, 8192, 16384, 32768)}, held_gib=6.0, requests_per_step=64,
        notes="6,144-token prompts, 128 out, p99 TTFT <= 3 s; the same 6 GiB co-tenant as dense-1gpu"),
)}
