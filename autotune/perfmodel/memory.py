"""The memory budget of one GPU, computed the way vLLM sizes its KV cache (REFERENCE.md §4):

    requested = total x gpu_memory_utilization
    KV        = requested - weights - activation peak - non-torch - CUDA-graph estimate

and the checks vLLM makes on the way (config validation, weights vs. device, one max-length request
vs. KV). Failures carry vLLM's wording so the same log classifier reads the simulator and vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from autotune import causes
from autotune.perfmodel.config import EngineConfig
from autotune.perfmodel.gpus import GPU
from autotune.perfmodel.profiles import ModelProfile

GiB = float(2**30)


@dataclass
class MemoryBudget:
    """Per GPU, in GiB, plus what vLLM would print about the KV cache."""

    total_gib: float
    requested_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    graphs_gib: float
    kv_gib: float
    kv_bytes_per_token: float
    kv_cache_tokens: int          # per engine (a DP replica), as vLLM logs it
    num_blocks: int
    max_concurrency: float        # full max-model-len requests the KV cache holds (vLLM's "x")
    capture_sizes: int
    fits: bool
    cause: str | None             # autotune.causes word when it does not fit
    reason: str                   # vLLM-like one line ("" when it fits)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def capture_sizes(max_num_seqs: int, enforce_eager: bool, capture_max: int | None = None) -> int:
    """How many batch sizes vLLM captures CUDA graphs for: [1, 2, 4] + 8..248 by 8 + 256.. by 16,
    up to `capture_max` (`--max-cudagraph-capture-size`), by default min(2 x max_num_seqs, 512). 51 at the
    default; 11 at max-num-seqs 32 or at a capture size of 64."""
    if enforce_eager:
        return 0
    top = min(2 * max_num_seqs, 512) if capture_max is None else capture_max
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return sum(1 for s in sizes if s <= top)


def graph_capture_max(cfg: EngineConfig) -> int:
    """The largest batch that runs inside a CUDA graph; 0 when none is captured (`--enforce-eager`, or
    `--optimization-level 0`: no compilation, no graphs). Larger decode batches run eagerly."""
    if cfg.enforce_eager or cfg.optimization_level == 0:
        return 0
    if cfg.max_cudagraph_capture_size is not None:
        return max(0, cfg.max_cudagraph_capture_size)
    return min(2 * cfg.max_num_seqs, 512)


def config_capture_sizes(cfg: EngineConfig) -> int:
    """capture_sizes for a resolved configuration (capture size, eager, optimization level)."""
    top = graph_capture_max(cfg)
    return capture_sizes(cfg.max_num_seqs, top == 0, top)


def dense_weight_bytes(profile: ModelProfile, cfg: EngineConfig) -> float:
    """Bytes per GPU of everything but the routed experts (read every step by every rank of a TP
    group): Linear layers at the quantized width, embedding and lm_head at theirs (quantization
    leaves them 16-bit), plus a profile's unexplained extra; split over TP and PP."""
    embed = min(profile.embedding_params, profile.dense_params)
    linear = profile.dense_params - embed
    whole = linear * cfg.weight_bytes + embed * cfg.embedding_bytes + profile.extra_weights_gib * GiB
    return whole / (cfg.tp * cfg.pp)


def expert_weight_bytes(profile: ModelProfile, cfg: EngineConfig) -> float:
    """Bytes per GPU of the routed experts: over TP x DP ranks with expert parallelism, else split
    over TP and replicated per DP replica."""
    expert_ranks = cfg.tp * cfg.dp if (cfg.ep and profile.is_moe) else cfg.tp
    return profile.routed_expert_params * cfg.weight_bytes / (expert_ranks * cfg.pp)


def vision_weight_bytes(profile: ModelProfile, cfg: EngineConfig) -> float:
    """Bytes per GPU of a VLM's vision encoder (16-bit: online quantization leaves most encoders alone):
    split over TP in the encoder's `weights` mode, whole on every rank in `data` mode; absent when
    --limit-mm-per-prompt allows no image (vLLM then does not build the encoder)."""
    if profile.vision is None or not cfg.images_enabled:
        return 0.0
    split = cfg.tp if cfg.mm_encoder_tp_mode == "weights" else 1
    return profile.vision.params * 2.0 / split


def weights_gib_per_gpu(profile: ModelProfile, cfg: EngineConfig) -> float:
    """What vLLM logs as "Model loading took X GiB" on one GPU."""
    return (dense_weight_bytes(profile, cfg) + expert_weight_bytes(profile, cfg)
            + vision_weight_bytes(profile, cfg)) / GiB


def max_tokens_per_image(profile: ModelProfile, cfg: EngineConfig) -> int:
    """vLLM's max_tokens_per_mm_item for images (0 for a text model or with images disabled)."""
    if profile.vision is None or not cfg.images_enabled:
        return 0
    return profile.vision.max_tokens_per_item(cfg.mm_processor_kwargs, cfg.mm_image_size)


@dataclass
class EncoderProfile:
    """vLLM's profiling run for a VLM (gpu_model_runner.profile_run): the encoder runs on `items` images
    of the largest size at once, then their embeddings stay while the language model's dummy pass runs."""

    items: int
    tokens_per_item: int
    peak_bytes: float          # the encoder pass itself
    outputs_bytes: float       # the embeddings kept through the language model's pass


def encoder_profile(profile: ModelProfile, cfg: EngineConfig) -> EncoderProfile | None:
    """items = the encoder budget (max(max-num-batched-tokens, one image)) over one image's tokens, at most
    the images max-num-seqs prompts can hold (multimodal/encoder_budget.py); None without images."""
    v = profile.vision
    per = max_tokens_per_image(profile, cfg)
    if v is None or per <= 0 or cfg.skip_mm_profiling:
        return None
    budget = max(cfg.max_num_batched_tokens, per)
    limit = 999 if cfg.mm_image_limit is None else cfg.mm_image_limit
    per_prompt = max(1, min(limit, cfg.max_model_len // per))
    seqs = cfg.max_num_seqs if cfg.chunked_prefill else min(cfg.max_num_seqs, cfg.max_num_batched_tokens // per)
    items = max(1, min(budget // per, max(seqs, 0) * per_prompt))
    patches = items * per * v.merge_size ** 2      # every merge x merge patches (or pixel-shuffled ones) make a token
    split = cfg.tp if cfg.mm_encoder_tp_mode == "weights" else 1
    peak = v.activation_bytes(patches) / split
    return EncoderProfile(items, per, peak, items * per * profile.hidden_size * 2.0 / cfg.tp)


def activation_gib(profile: ModelProfile, cfg: EngineConfig) -> float:
    """Peak of vLLM's profiling forward pass at max-num-batched-tokens, plus the sampler's logits
    for max-num-seqs sequences. Grows with both flags. A VLM profiles its encoder first: the peak is the
    encoder's pass, or the language model's pass with the image embeddings still held, whichever is larger."""
    tokens = cfg.max_num_batched_tokens
    if profile.is_moe:
        inter = profile.moe_intermediate_size * profile.experts_per_token * 2
        inter /= 1 if cfg.ep else cfg.tp
    else:
        inter = profile.intermediate_size / cfg.tp
    per_token = profile.hidden_size * 8 + inter * 4
    logits = min(cfg.max_num_seqs, tokens) * profile.vocab_size / cfg.tp * 4
    lm = tokens * per_token + logits
    enc = encoder_profile(profile, cfg)
    if enc is not None:
        lm = max(lm + enc.outputs_bytes, enc.peak_bytes)
    return lm / GiB


def graphs_gib(profile: ModelProfile, cfg: EngineConfig) -> float:
    n = config_capture_sizes(cfg)
    if n == 0:
        return 0.0
    base = profile.graph_base_gib if profile.graph_base_gib is not None else 0.02
    per = profile.graph_per_size_gib
    if per is None:  # 0.98 GiB at 51 sizes for a 32-layer 8B (vLLM 0.24 log on an H200)
        per = 0.019 * math.sqrt(profile.num_layers / cfg.pp / 32)
    return base + n * per


def non_torch_gib(profile: ModelProfile, cfg: EngineConfig) -> float:
    """CUDA context and NCCL buffers, plus memory a calibrated profile reserves."""
    return 0.25 + (0.35 if cfg.world_size > 1 else 0.0) + profile.reserved_gib


def _pydantic(config: str, message: str) -> str:
    return f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {config}\n  Value error, {message}"


def validate(profile: ModelProfile, cfg: EngineConfig, num_gpus: int) -> str | None:
    """vLLM's config validation (before any memory is touched); the error text or None."""
    if not 0 < cfg.gmu <= 1:
        return _pydantic("CacheConfig", f"gpu_memory_utilization must be in (0, 1], got {cfg.gmu}")
    if cfg.world_size > num_gpus:
        return _pydantic("ParallelConfig", f"World size ({cfg.world_size} = TP {cfg.tp} x PP {cfg.pp} x DP "
                         f"{cfg.dp}) is larger than the number of available GPUs ({num_gpus}).")
    if profile.num_heads % cfg.tp:
        return _pydantic("ModelConfig", f"Total number of attention heads ({profile.num_heads}) must be "
                         f"divisible by tensor parallel size ({cfg.tp}).")
    if profile.num_layers < cfg.pp:
        return _pydantic("ModelConfig", f"pipeline parallel size ({cfg.pp}) exceeds the number of layers "
                         f"({profile.num_layers}).")
    if cfg.max_model_len > profile.max_position:
        return _pydantic("ModelConfig", f"User-specified max_model_len ({cfg.max_model_len}) is greater than "
                         f"the derived max_model_len (max_position_embeddings={float(profile.max_position)} "
                         "or model_max_length=None in model's config.json).")
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        return _pydantic("SchedulerConfig", f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be "
                         f"greater than or equal to max_num_seqs ({cfg.max_num_seqs}).")
    per_image = max_tokens_per_image(profile, cfg)
    if cfg.disable_chunked_mm_input and per_image > cfg.max_num_batched_tokens:
        return (f"ValueError: Chunked MM input disabled but max_tokens_per_mm_item ({per_image}) is larger than "
                f"max_num_batched_tokens ({cfg.max_num_batched_tokens}). Please increase max_num_batched_tokens.")
    if not cfg.chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        return _pydantic("SchedulerConfig", f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) is smaller "
                         f"than max_model_len ({cfg.max_model_len}). This effectively limits the maximum sequence "
                         "length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
                         "max_num_batched_tokens or decrease max_model_len.")
    return None


def memory_budget(profile: ModelProfile, cfg: EngineConfig, gpu: GPU, num_gpus: int) -> MemoryBudget:
    """The per-GPU budget and whether vLLM would start. Config errors come first (cause bad_config),
    then weights against the device (startup_oom), then the KV cache (kv_too_small)."""
    total = gpu.memory_gib
    requested = math.ceil(gpu.memory_bytes * cfg.gmu) / GiB
    weights = weights_gib_per_gpu(profile, cfg)
    act = activation_gib(profile, cfg)
    other = non_torch_gib(profile, cfg)
    graphs = graphs_gib(profile, cfg)
    if cfg.kv_cache_memory_bytes is not None:
        kv = cfg.kv_cache_memory_bytes / GiB
    else:
        kv = requested - weights - act - other - graphs
    bpt = profile.kv_bytes_per_token_per_gpu(cfg.tp, cfg.pp, cfg.kv_dtype_bytes)
    blocks = max(0, int(kv * GiB // (bpt * cfg.block_size)))
    tokens = blocks * cfg.block_size
    per_request_blocks = math.ceil(cfg.max_model_len / cfg.block_size)
    concurrency = blocks / per_request_blocks if per_request_blocks else 0.0
    budget = MemoryBudget(total, requested, weights, act, other, graphs, kv, bpt, tokens, blocks,
                          concurrency, config_capture_sizes(cfg), True, None, "")
    error = validate(profile, cfg, num_gpus)
    if error:
        budget.fits, budget.cause, budget.reason = False, causes.BAD_CONFIG, error
    elif weights + other > total:
        free_mib = max(0.0, total - other - (weights - weights / max(profile.num_layers, 1))) * 1024
        budget.fits, budget.cause = False, causes.STARTUP_OOM
        budget.reason = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                         f"{weights / max(profile.num_layers, 1):.2f} GiB. GPU 0 has a total capacity of "
                         f"{total:.2f} GiB of which {free_mib:.2f} MiB is free. (weights need {weights:.2f} GiB "
                         "per GPU)")
    elif cfg.kv_cache_memory_bytes is not None and weights + act + other + graphs + kv > total:
        # --kv-cache-memory-bytes bypasses the memory fraction: the bytes are allocated as asked, and
        # what does not fit beside the weights, activations and graphs is an OOM at startup
        budget.fits, budget.cause = False, causes.STARTUP_OOM
        budget.reason = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {kv:.2f} GiB for the KV "
                         f"cache (--kv-cache-memory-bytes). GPU 0 has a total capacity of {total:.2f} GiB "
                         f"(weights {weights:.2f} + activations {act:.2f} + graphs {graphs:.2f} + other "
                         f"{other:.2f} GiB already)")
    elif kv <= 0:
        budget.fits, budget.cause = False, causes.KV_TOO_SMALL
        budget.reason = ("ValueError: No available memory for the cache blocks. Try increasing "
                         "`gpu_memory_utilization` when initializing the engine. "
                         f"(weights {weights:.2f} GiB + activations {act:.2f} GiB + graphs {graphs:.2f} GiB "
                         f"exceed the requested {requested:.2f} GiB)")
    elif per_request_blocks > blocks:
        needed = per_request_blocks * cfg.block_size * bpt / GiB
        estimated = tokens
        budget.fits, budget.cause = False, causes.KV_TOO_SMALL
        budget.reason = (f"ValueError: To serve at least one request with the model's max seq len "
                         f"({cfg.max_model_len}), ({needed:.2f} GiB KV cache is needed, which is larger than the "
                         f"available KV cache memory ({kv:.2f} GiB). Based on the available memory, the estimated "
                         f"maximum model length is {estimated}. Try increasing `gpu_memory_utilization` or "
                         "decreasing `max_model_len` when initializing the engine.")
    return budget


# Memory a busy engine uses beyond its --gpu-memory-utilization budget, fitted to a real vLLM 0.24 run
# on an H200 (7 trials, GMU 0.80-0.97, 4k-32k batched tokens): NVML's peak used, less the 0.6 GiB the
# driver reserves (NVML total 140.40 vs CUDA total 139.80 GiB), ran 1.3-2.8 GiB past GMU x total, with no
# OOM. Least squares: 1.74 GiB + 4.8 bytes x hidden per prefill token (residuals within 0.6 GiB). It is
# absolute: workspaces, allocator slack and prefill temporaries scale with the step and the model, not
# with the card, so GMU 0.97 leaves 4.2 GiB on an H200 (survives) but 0.98 only 1.6 GiB on an H100
# (the 9B article setup dies under load, as seed 003 saw).
RUNTIME_BASE_GIB = 1.75
RUNTIME_PREFILL_BYTES_PER_HIDDEN = 5.0


def runtime_transient_gib(profile: ModelProfile, cfg: EngineConfig, running: int, step_tokens: int) -> float:
    """Memory a busy step needs beyond the preallocated budget: allocator slack and workspaces,
    sampler buffers and prefill temporaries that vLLM's profiling run does not see. It must fit in
    the part of the device that --gpu-memory-utilization left out, or the server dies under load."""
    sampler = running * profile.vocab_size / cfg.tp * 12 / GiB
    prefill = step_tokens * profile.hidden_size * RUNTIME_PREFILL_BYTES_PER_HIDDEN / cfg.tp / GiB
    return RUNTIME_BASE_GIB + sampler + prefill


def headroom_gib(gpu: GPU, cfg: EngineConfig) -> float:
    """The device memory --gpu-memory-utilization leaves outside vLLM's budget (GiB)."""
    return gpu.memory_gib - math.ceil(gpu.memory_bytes * cfg.gmu) / GiB
