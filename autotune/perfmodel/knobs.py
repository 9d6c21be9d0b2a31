"""What the twin (perfmodel/ and sim/) models of each knob, and what it does not.

A knob the twin does not model leaves its predictions unchanged, so a ranking by the twin would read
"no effect" where nothing is known. Every consumer that ranks or predicts with the twin asks here first:
the warm start (tuner/warmstart.py) ranks only modelled knobs and leaves the others to the sampler, and
`show` names the unmodelled knobs beside the twin's predictions.

Keys are vLLM flag names without `--` (underscores), or `env:NAME` for a variable read from the
launch environment. A knob absent from both tables is unmodelled.
"""

from __future__ import annotations

from typing import Iterable

# knob -> how the twin models it (and the measurement it was checked against, where one exists)
MODELLED: dict[str, str] = {
    "gpu_memory_utilization": "memory budget: KV = fraction x device - weights - activations - graphs - other "
                              "(benchmarks/sim_calibration.md)",
    "max_num_seqs": "scheduler seats; default CUDA-graph capture size 2 x seqs (seed 001: 86 s / 3.46 GiB at "
                    "256 vs 66 s / 2.71 GiB at 32)",
    "max_num_batched_tokens": "per-step token budget; activation peak of the profiling run",
    "enable_chunked_prefill": "prompts split over steps by the token budget",
    "enable_prefix_caching": "block-hashed prefix cache with LRU eviction",
    "tensor_parallel_size": "weights and KV split; all-reduce on the link",
    "pipeline_parallel_size": "layers split; a bubble per extra stage",
    "data_parallel_size": "replicas in lockstep, each with its own KV cache",
    "enable_expert_parallel": "experts over TP x DP ranks; all-to-all on the link",
    "quantization": "bytes per weight and the matmul dtype (FP8 fit to five real H200 trials)",
    "kv_cache_dtype": "bytes per KV element",
    "max_model_len": "one max-length request must fit the KV cache",
    "enforce_eager": "no CUDA graphs: per-layer launch overhead every step, no graph memory",
    "async_scheduling": "CPU step overhead x 0.6 when on (an assumption: no measurement with it off exists)",
    "max_cudagraph_capture_size": "decode batches above it run eagerly (per-layer launch overhead); graph "
                                  "memory from the number of captured sizes (checked: a capture size of 64 at "
                                  "seqs 256 reproduces the seed-001 2.71 GiB of seqs 32)",
    "kv_cache_memory_bytes": "KV memory = the bytes, the fraction ignored (as vLLM); a value that does not fit "
                             "beside weights, activations and graphs is a startup OOM",
    "long_prefill_token_threshold": "one prompt's chunk per step is capped while other requests wait (vLLM v1's "
                                    "scheduler rule); no measurement of it exists in benchmarks/",
    "optimization_level": "0 = no graphs (as --enforce-eager), 1 = piecewise graphs only (attention outside "
                          "the graph every step), 2 and 3 = today's default (vLLM: O3 is O2); compile time "
                          "is not modelled",
    "limit_mm_per_prompt": "a VLM's images per prompt: how many of the largest image vLLM's profiling pass "
                           "encodes, requests with more images refused (HTTP 400), 0 drops the encoder",
    "mm_processor_kwargs": "max_pixels (Qwen2-VL family) or size (Idefics3): tokens per image by the processor's "
                           "resize rule, and the largest image profiled",
    "mm_encoder_tp_mode": "the vision encoder's weights and FLOPs split over TP ranks (weights) or whole on each "
                          "(data); its per-layer all-reduce is not modelled",
}

# knob -> why the twin cannot say what it does (its effect is left to measurement)
UNMODELLED: dict[str, str] = {
    # prefill/decode splits: `estimate --pd` and the simulator's instances model them (perfmodel/disagg.py),
    # but the warm start's one-server prediction does not, so it ranks no split
    "pd_prefill": "a split's prefill instances: estimate --pd models them; the warm start's ranking does not",
    "pd_decode": "a split's decode instances: estimate --pd models them; the warm start's ranking does not",
    "pd_kv_buffer_device": "where the connector stages the KV it moves (host copies in estimate --pd only)",
    "stream_interval": "host-side streaming overhead and token arrival in chunks are not in the twin",
    "performance_mode": "kernel choices per mode are not in the twin (only its doubled defaults are)",
    "attention_backend": "per-backend kernel speed is not in the twin",
    "block_size": "attention kernel speed per block size is not in the twin (only KV rounding is)",
    "enable_dbo": "dual-batch overlap of compute and all-to-all is not in the twin",
    "enable_eplb": "expert load imbalance is not in the twin (routing is uniform there)",
    "speculative_config": "the acceptance rate depends on how predictable the real text is",
    "cudagraph_capture_sizes": "an explicit size list is not in the twin (only the largest size is)",
    "max_num_partial_prefills": "concurrent partial prefill (refused by vLLM's v1 engine) is not in the twin",
    "max_long_partial_prefills": "concurrent partial prefill (refused by vLLM's v1 engine) is not in the twin",
    "mm_processor_cache_gb": "host memory and the processor's time on a repeated image are not in the twin",
    "disable_chunked_mm_input": "the twin checks its startup rule (the largest image within the token budget) "
                                "but does not keep an image's tokens in one step",
}


def env_key(name: str) -> str:
    """The key of an environment-variable knob in these tables."""
    return f"env:{name}"


def modelled(knobs: Iterable[str]) -> bool:
    """True when the twin models every one of `knobs` (a composite choice sets several flags)."""
    return all(k in MODELLED for k in knobs)


def why_unmodelled(knob: str) -> str:
    if knob.startswith("env:"):
        return UNMODELLED.get(knob, "environment variables are not read by the twin")
    return UNMODELLED.get(knob, "not in the twin")
