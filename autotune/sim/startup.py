"""What the twin prints while "starting", in vLLM's words, so `autotune.engine.logparse` reads the
simulator and vLLM alike: KV cache size, maximum concurrency, model loading, graph capture, init
time, and on failure the root-cause line followed by "Engine core initialization failed".
Every run is labelled: the banner says simulated and the version reads `0.32.0+sim`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass

from autotune.perfmodel.predict import Plan

VERSION = "0.32.0+sim"


def setup_logging() -> logging.Logger:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(
        f"(APIServer pid={os.getpid()}) %(levelname)s %(asctime)s [sim] %(message)s", datefmt="%m-%d %H:%M:%S"))
    root = logging.getLogger("autotune.sim")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    return root


@dataclass
class StartupTimes:
    """Simulated seconds; the seed-001 GLM-5.3 figures (weights 36 s hot, graphs 66-86 s) and the
    0.24 8B log (weights 3.8 s, compile 18 s, graphs 4 s, init 41 s) anchor them."""

    load_s: float
    compile_s: float
    graphs_s: float

    @property
    def init_s(self) -> float:
        return self.compile_s + self.graphs_s + 5.0

    @property
    def total_s(self) -> float:
        return self.load_s + self.init_s + 8.0


def startup_times(plan: Plan) -> StartupTimes:
    b, cfg, p = plan.budget, plan.config, plan.profile
    load = 1.0 + b.weights_gib / 3.5
    compile_s = 0.0 if cfg.enforce_eager else 18.0 * math.sqrt(p.num_layers / 32)
    graphs = b.capture_sizes * 0.08 * (p.num_layers / 32) * (4.0 if p.attention == "mla" else 1.0)
    return StartupTimes(load, compile_s, graphs)


def log_banner(log: logging.Logger, plan: Plan, model: str, non_default: dict[str, object]) -> None:
    log.info("autotune vLLM simulator -- SIMULATED, no GPU is used -- version %s", VERSION)
    log.info("simulated hardware: %d x %s (%.2f GiB, %.2f TB/s); model profile %s", plan.num_gpus,
             plan.gpu.name, plan.gpu.memory_gib, plan.gpu.hbm_tbps, plan.profile.describe())
    log.info("non-default args: %s", {"model": model, **non_default})
    cfg = plan.config
    log.info("Using max model len %d", cfg.max_model_len)
    if cfg.chunked_prefill:
        log.info("Chunked prefill is enabled with max_num_batched_tokens=%d.", cfg.max_num_batched_tokens)


def log_ready(log: logging.Logger, plan: Plan, times: StartupTimes) -> None:
    b, cfg = plan.budget, plan.config
    log.info("Model loading took %.2f GiB and %.6f seconds", b.weights_gib, times.load_s)
    if times.compile_s:
        log.info("torch.compile took %.2f s in total", times.compile_s)
    log.info("Available KV cache memory: %.2f GiB", b.kv_gib)
    log.info("GPU KV cache size: %s tokens", f"{b.kv_cache_tokens:,}")
    log.info("Maximum concurrency for %s tokens per request: %.2fx", f"{cfg.max_model_len:,}", b.max_concurrency)
    if b.capture_sizes:
        log.info("Graph capturing finished in %d secs, took %.2f GiB", round(times.graphs_s), b.graphs_gib)
    log.info("init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
             times.init_s, times.compile_s)


def log_failure(log: logging.Logger, reason: str) -> None:
    """The root cause as vLLM's EngineCore prints it, then the API server's summary line."""
    log.error("EngineCore failed to start.")
    log.error("Traceback (most recent call last):")
    for line in reason.splitlines():
        log.error("%s", line)
    log.error("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
