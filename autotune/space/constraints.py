"""Known constraints between vLLM flags. A candidate that breaks one never launches: vLLM would refuse
it at startup after a minute of loading, or it asks for more GPUs than the study was given."""

from __future__ import annotations

import json
from typing import Any, Mapping

from autotune.pdlayout import instances_of

# vLLM's v1 engine (every version since 0.11) refuses concurrent partial prefill at startup
# ("NotImplementedError: Concurrent Partial Prefill is not supported", reported on 0.23 and 0.24); the
# flags were removed in 0.27. A value above 1 can only cost a launch.
PARTIAL_PREFILL = ("max_num_partial_prefills", "max_long_partial_prefills")
DBO_BACKENDS = ("deepep_low_latency", "deepep_high_throughput", "nixl_ep")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def violations(effective: Mapping[str, Any], num_gpus: int, model_max_len: int | None = None,
               multimodal: Any = None) -> list[str]:
    """`effective` holds fixed flags and the candidate's params merged (params win), flag names with
    underscores. Values the candidate leaves to vLLM are absent and never judged, except the maximum
    length: with no `--max-model-len`, vLLM takes the model's own (`model_max_len`, from its
    config.json), and a token budget below it with chunked prefill off is refused just the same.
    `multimodal` (space/multimodal.MultimodalContext) adds a VLM's: images per prompt at least the
    workload's, and, with chunked MM input off, a token budget that holds the largest image."""
    out: list[str] = []
    seqs = _int(effective.get("max_num_seqs"))
    batched = _int(effective.get("max_num_batched_tokens"))
    model_len = _int(effective.get("max_model_len"))
    source = ""
    if model_len is None or model_len == -1:  # -1: vLLM fits the length to memory, at most the model's
        model_len, source = model_max_len, ", the model's own from its config.json"
    chunked = effective.get("enable_chunked_prefill")
    if seqs is not None and batched is not None and batched < seqs:
        out.append(f"max_num_batched_tokens ({batched}) < max_num_seqs ({seqs})")
    if chunked is False and batched is not None and model_len is not None and batched < model_len:
        out.append(f"max_num_batched_tokens ({batched}) < max_model_len ({model_len}{source}) "
                   "with chunked prefill off")
    tp = _int(effective.get("tensor_parallel_size")) or 1
    pp = _int(effective.get("pipeline_parallel_size")) or 1
    dp = _int(effective.get("data_parallel_size")) or 1
    instances = instances_of(effective)
    if tp * pp * dp * instances > max(num_gpus, 1):
        each = f"{instances} instances x " if instances > 1 else ""
        out.append(f"{each}TP x PP x DP = {each}{tp}x{pp}x{dp} = {tp * pp * dp * instances} GPUs > "
                   f"{max(num_gpus, 1)} given")
    if effective.get("enable_expert_parallel") is True and tp * dp == 1:
        out.append("expert parallelism needs TP x DP > 1")
    out += _scheduler_knobs(effective, chunked)
    out += _moe_knobs(effective, tp, dp)
    spec_method = speculative_method(effective.get("speculative_config"))
    if effective.get("async_scheduling") is True and spec_method == "ngram":
        out.append("--async-scheduling with n-gram speculative decoding: vLLM refuses it (async scheduling "
                   "runs only with EAGLE/MTP-style drafts); leave async scheduling to vLLM")
    sizes = _sizes(effective.get("cudagraph_capture_sizes"))
    cap = _int(effective.get("max_cudagraph_capture_size"))
    if sizes and cap is not None and cap != max(sizes):
        out.append(f"max_cudagraph_capture_size ({cap}) differs from the largest of cudagraph_capture_sizes "
                   f"({max(sizes)}): vLLM refuses the pair")
    if multimodal is not None:
        out += _multimodal(effective, batched, multimodal)
    return out


def _scheduler_knobs(effective: Mapping[str, Any], chunked: Any) -> list[str]:
    out: list[str] = []
    partial = {k: _int(effective.get(k)) for k in PARTIAL_PREFILL}
    for key, value in partial.items():
        if value is not None and value > 1:
            out.append(f"{key} ({value}) > 1: vLLM's v1 engine refuses concurrent partial prefill at startup"
                       + (" (and it needs chunked prefill)" if chunked is False else ""))
    if None not in partial.values() and partial["max_long_partial_prefills"] > partial["max_num_partial_prefills"]:
        out.append("max_long_partial_prefills above max_num_partial_prefills")
    threshold = _int(effective.get("long_prefill_token_threshold"))
    if chunked is False and threshold:
        out.append(f"long_prefill_token_threshold ({threshold}) needs chunked prefill (without it no prompt is split)")
    return out


def _moe_knobs(effective: Mapping[str, Any], tp: int, dp: int) -> list[str]:
    """Dual-batch overlap and expert load balancing exist for data and expert parallelism only."""
    out: list[str] = []
    ep = effective.get("enable_expert_parallel") is True
    if effective.get("enable_dbo") is True:
        if dp == 1 and not ep:
            out.append("enable_dbo needs data or expert parallelism (DP > 1 or --enable-expert-parallel)")
        backend = str(effective.get("all2all_backend") or "")
        if backend not in DBO_BACKENDS:
            out.append(f"enable_dbo needs --all2all-backend {' or '.join(DBO_BACKENDS)} (vLLM's micro-batching "
                       f"runs on those only), not {backend or 'the default'}")
    if effective.get("enable_eplb") is True and (not ep or tp * dp == 1):
        out.append("enable_eplb needs expert parallelism with TP x DP > 1")
    return out


def needs_fixed(knobs: list[str], fixed: Mapping[str, Any]) -> str | None:
    """Why a knob cannot launch in any candidate under these fixed flags, or None."""
    if "enable_dbo" in knobs and str(fixed.get("all2all_backend") or "") not in DBO_BACKENDS:
        return (f"dual-batch overlap needs --all2all-backend {' or '.join(DBO_BACKENDS)} in the fixed flags "
                "(with DeepEP installed)")
    return None


def speculative_method(config: Any) -> str | None:
    """The method of a `--speculative-config` JSON value (a draft model without one: draft_model)."""
    if not config:
        return None
    try:
        doc = json.loads(config) if isinstance(config, str) else dict(config)
    except (TypeError, ValueError):
        return None
    if not isinstance(doc, Mapping):
        return None
    method = doc.get("method")
    if method:
        return str(method)
    return "draft_model" if doc.get("model") else None


def _sizes(value: Any) -> list[int]:
    if value in (None, "", False):
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    out = [_int(v) for v in items]
    return [v for v in out if v is not None]


def notes(effective: Mapping[str, Any]) -> list[str]:
    """What a launch allows but a reader should know: settings vLLM accepts that leave part of the work
    unaccelerated or ignore another flag. Warnings, not rejections (the measurement decides)."""
    out: list[str] = []
    cap = _int(effective.get("max_cudagraph_capture_size"))
    seqs = _int(effective.get("max_num_seqs"))
    eager = effective.get("enforce_eager") is True or _int(effective.get("optimization_level")) == 0
    if cap is not None and eager:
        out.append(f"max_cudagraph_capture_size {cap} has no effect: no CUDA graphs are captured (eager or -O0)")
    elif cap is not None and seqs is not None and cap < seqs:
        out.append(f"decode batches above {cap} (the CUDA-graph capture size) run without CUDA graphs, up to "
                   f"max_num_seqs {seqs}")
    if effective.get("kv_cache_memory_bytes") not in (None, "") and effective.get("gpu_memory_utilization") is not None:
        out.append("kv_cache_memory_bytes is set: vLLM sizes the KV cache from it and ignores "
                   "gpu_memory_utilization")
    return out


def _multimodal(effective: Mapping[str, Any], batched: int | None, mm: Any) -> list[str]:
    from autotune.space.multimodal import image_limit_of

    out: list[str] = []
    limit = image_limit_of(effective.get("limit_mm_per_prompt"))
    if limit is not None and limit < mm.max_images:
        out.append(f"limit_mm_per_prompt allows {limit} image(s) per prompt, the workload sends up to {mm.max_images}")
    if effective.get("disable_chunked_mm_input") is True and batched is not None:
        per_image = mm.max_tokens_per_image(effective.get("mm_processor_kwargs"))
        if per_image > batched:
            out.append(f"max_num_batched_tokens ({batched}) < the largest image's {per_image} tokens with "
                       "chunked MM input off")
    return out
