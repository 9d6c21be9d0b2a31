"""Known constraints between vLLM flags. A candidate that breaks one never launches: vLLM would refuse
it at startup after a minute of loading, or it asks for more GPUs than the study was given."""

from __future__ import annotations

from typing import Any, Mapping


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def violations(effective: Mapping[str, Any], num_gpus: int, model_max_len: int | None = None) -> list[str]:
    """`effective` holds fixed flags and the candidate's params merged (params win), flag names with
    underscores. Values the candidate leaves to vLLM are absent and never judged, except the maximum
    length: with no `--max-model-len`, vLLM takes the model's own (`model_max_len`, from its
    config.json), and a token budget below it with chunked prefill off is refused just the same."""
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
    if tp * pp * dp > max(num_gpus, 1):
        out.append(f"TP x PP x DP = {tp}x{pp}x{dp} = {tp * pp * dp} GPUs > {max(num_gpus, 1)} given")
    if effective.get("enable_expert_parallel") is True and tp * dp == 1:
        out.append("expert parallelism needs TP x DP > 1")
    return out
