"""The free feasibility prior: would vLLM start with these flags on this hardware, and with how much KV?

The trial runner calls `predict_launch` before spending a launch; `estimate` and the simulator call
`plan` for the whole budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autotune.errors import UserError
from autotune.pdlayout import split_pd_flags
from autotune.perfmodel.config import EngineConfig, parse_vllm_flags, resolve
from autotune.perfmodel.gpus import GPU, find_gpu, get_gpu
from autotune.perfmodel.memory import MemoryBudget, memory_budget
from autotune.perfmodel.profiles import ModelProfile, find_profile, load_profile


@dataclass
class Plan:
    profile: ModelProfile
    gpu: GPU
    num_gpus: int
    config: EngineConfig
    budget: MemoryBudget


@dataclass
class Prediction:
    fits: bool
    reason: str                 # vLLM-like one line; "" when it fits
    cause: str | None           # autotune.causes word when it does not fit
    kv_cache_tokens: int
    max_concurrency: float
    weights_gib_per_gpu: float
    budget: MemoryBudget


def plan(model: str, flags: Sequence[str], gpu: str, num_gpus: int) -> Plan:
    """Resolve everything; raises UserError for an unknown model/GPU or a flag vLLM would reject."""
    profile = load_profile(model)
    g = get_gpu(gpu)
    if num_gpus < 1:
        raise UserError(f"--num-gpus must be >= 1, got {num_gpus}")
    cfg = resolve(parse_vllm_flags(flags), profile, g)
    return Plan(profile, g, num_gpus, cfg, memory_budget(profile, cfg, g, num_gpus))


def predict_launch(model: str, flags: Sequence[str], gpu: str | None, num_gpus: int) -> Prediction | None:
    """None when the model profile or the GPU is unknown (e.g. a tiny local model on the CPU), or the
    flags are outside what the model understands: the runner then simply launches."""
    if find_gpu(gpu) is None or find_profile(model) is None:
        return None
    try:
        _, flags = split_pd_flags(flags)   # a PD layout: each instance is this launch on its own GPUs
        p = plan(model, flags, gpu or "", max(num_gpus, 1))
    except UserError:
        return None
    b = p.budget
    return Prediction(b.fits, b.reason.splitlines()[0] if b.reason else "", b.cause, b.kv_cache_tokens,
                      b.max_concurrency, b.weights_gib, b)
