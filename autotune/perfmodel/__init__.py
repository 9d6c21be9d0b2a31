"""The physics of serving: GPU and model catalogs, the memory budget, roofline step times.

Used by `autotune estimate`, by the simulator (`autotune sim-serve`) and by the tuner's free
feasibility check (`predict_launch`)."""

from autotune.perfmodel.config import EngineConfig, known_flags, parse_vllm_flags, resolve
from autotune.perfmodel.gpus import GPU, find_gpu, get_gpu, gpu_names
from autotune.perfmodel.memory import MemoryBudget, memory_budget
from autotune.perfmodel.predict import Plan, Prediction, plan, predict_launch
from autotune.perfmodel.profiles import ModelProfile, builtin_names, find_profile, load_profile

__all__ = [
    "EngineConfig", "GPU", "MemoryBudget", "ModelProfile", "Plan", "Prediction", "builtin_names",
    "find_gpu", "find_profile", "get_gpu", "gpu_names", "known_flags", "load_profile", "memory_budget",
    "parse_vllm_flags", "plan", "predict_launch", "resolve",
]
