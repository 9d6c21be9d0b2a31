"""vLLM's serve flags as the models read them: one parser shared by `sim-serve`, `estimate`, the
sim engine's flag check and the tuner's feasibility prior, so all four agree on what a flag means.

Only flags that change memory or speed carry meaning here; the other common `vllm serve` flags are
accepted and ignored (a tuning study passes them through), and anything else is an argparse error,
as vLLM itself would report it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from autotune.errors import UserError
from autotune.flags import mapping_to_flags
from autotune.perfmodel.gpus import GPU
from autotune.perfmodel.profiles import ModelProfile

# quantization -> (bytes per weight of the decoder's Linear layers, matmul dtype on GPUs with FP8 tensor cores)
_QUANT: dict[str, tuple[float, str]] = {
    "fp8": (1.0, "fp8"), "fbgemm_fp8": (1.0, "fp8"), "modelopt": (1.0, "fp8"), "ptpc_fp8": (1.0, "fp8"),
    "compressed-tensors": (1.0, "int8"), "experts_int8": (1.0, "bf16"),
    "awq": (0.5, "bf16"), "awq_marlin": (0.5, "bf16"), "gptq": (0.5, "bf16"), "gptq_marlin": (0.5, "bf16"),
    "bitsandbytes": (0.5, "bf16"), "gguf": (0.56, "bf16"), "mxfp4": (0.53, "bf16"),
}
# Methods that quantize the token embedding and lm_head too. Every other method (and a natively FP8
# checkpoint) converts only the Linear layers: vLLM's online `--quantization fp8` leaves
# VocabParallelEmbedding and ParallelLMHead in the model dtype (a 32k-vocab Llama-8B shape measured 7.03 GiB
# on an H200, not the 6.74 GiB of one byte per parameter), as AWQ/GPTQ/bitsandbytes/MXFP4 checkpoints and
# DeepSeek-style FP8 checkpoints do. GGUF's bytes per weight are already an average over the whole file.
_QUANT_INCLUDES_EMBEDDINGS = frozenset({"gguf"})
_KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

# Accepted vLLM flags that take one value and do not change the simulated physics.
_IGNORED_VALUED = (
    "--tokenizer", "--revision", "--tokenizer-revision", "--tokenizer-mode", "--load-format",
    "--download-dir", "--distributed-executor-backend", "--swap-space", "--cpu-offload-gb",
    "--max-seq-len-to-capture", "--uvicorn-log-level", "--api-key", "--chat-template",
    "--generation-config", "--max-num-partial-prefills", "--max-long-partial-prefills",
    "--scheduling-policy", "--compilation-config", "--stream-interval", "--cudagraph-capture-sizes",
    "--cuda-graph-sizes", "--speculative-config", "--hf-overrides", "--override-generation-config",
    "--reasoning-parser", "--tool-call-parser", "--guided-decoding-backend", "--structured-outputs-config",
    "--max-logprobs", "--root-path", "--allowed-origins", "--lora-modules", "--mm-processor-cache-type",
    "--worker-extension-cls", "--attention-backend", "--shutdown-timeout", "--max-parallel-loading-workers",
    "--tokenizer-pool-size", "--otlp-traces-endpoint", "--ssl-keyfile", "--ssl-certfile", "--chat-template-content-format",
)
_IGNORED_SWITCHES = (
    "--trust-remote-code", "--disable-log-stats", "--disable-log-requests", "--enable-log-requests",
    "--disable-frontend-multiprocessing", "--enable-auto-tool-choice", "--disable-custom-all-reduce",
    "--disable-sliding-window", "--enable-sleep-mode", "--skip-tokenizer-init", "--enable-lora",
    "--disable-uvicorn-access-log", "--headless", "--enable-prompt-tokens-details", "--enable-force-include-usage",
)
# Accepted boolean knobs (both forms) that do not change the simulated physics (perfmodel/knobs.py says why).
_IGNORED_BOOLEANS = ("--enable-dbo", "--enable-eplb")


def add_vllm_arguments(p: argparse.ArgumentParser) -> None:
    """The vLLM serve flags the simulator understands (names and spellings as in `vllm serve`)."""
    g = p.add_argument_group("vLLM flags (simulated)")
    g.add_argument("model_tag", nargs="?", help="model (positional, as in `vllm serve MODEL`)")
    g.add_argument("--model")
    g.add_argument("--served-model-name", nargs="+")
    g.add_argument("--config", help="YAML whose keys are flag names without '--' (vLLM's --config)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    g.add_argument("--max-num-seqs", type=int)
    g.add_argument("--max-num-batched-tokens", type=int)
    g.add_argument("--max-model-len", type=_max_model_len)
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--quantization", "-q", choices=sorted(_QUANT))
    g.add_argument("--kv-cache-dtype", choices=_KV_DTYPES, default="auto")
    g.add_argument("--dtype", choices=_DTYPES, default="auto")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    g.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    g.add_argument("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, default=False)
    g.add_argument("--block-size", type=int, choices=(1, 8, 16, 32, 64, 128, 256), default=16)
    g.add_argument("--enforce-eager", action="store_true")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--kv-cache-memory-bytes", type=_human_int)
    g.add_argument("--max-cudagraph-capture-size", type=int)
    g.add_argument("--long-prefill-token-threshold", type=int, default=0)
    g.add_argument("--optimization-level", "-O", type=int, choices=(0, 1, 2, 3), default=2)
    g.add_argument("--performance-mode", choices=("balanced", "interactivity", "throughput"), default="balanced")
    g.add_argument("--num-gpu-blocks-override", type=int)
    # disaggregated prefill/decode: the KV connector (sim/server.py plays its side of kv_transfer_params)
    g.add_argument("--kv-transfer-config", type=_json_object, default=None)
    g.add_argument("--seed-vllm", dest="vllm_seed", type=int, help=argparse.SUPPRESS)
    # multimodal: what an image costs (perfmodel/vision.py) and what the server accepts
    g.add_argument("--limit-mm-per-prompt", type=_json_object, default=None)
    g.add_argument("--mm-processor-kwargs", type=_json_object, default=None)
    g.add_argument("--mm-processor-cache-gb", type=float, default=4.0)
    g.add_argument("--mm-encoder-tp-mode", choices=("data", "weights"), default="weights")
    g.add_argument("--disable-chunked-mm-input", action=argparse.BooleanOptionalAction, default=False)
    g.add_argument("--skip-mm-profiling", action=argparse.BooleanOptionalAction, default=False)
    for flag in _IGNORED_VALUED:
        g.add_argument(flag, help=argparse.SUPPRESS)
    for flag in _IGNORED_SWITCHES:
        g.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in _IGNORED_BOOLEANS:
        g.add_argument(flag, action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)


def _json_object(text: str) -> dict[str, Any]:
    """vLLM's JSON-valued flags (--limit-mm-per-prompt '{"image": 2}')."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def image_limit(limits: dict[str, Any] | None) -> tuple[int | None, tuple[int, int] | None]:
    """(images per prompt, the largest image size the server is told to expect) from
    --limit-mm-per-prompt: `{"image": 2}` or `{"image": {"count": 2, "width": 512, "height": 512}}`."""
    entry = (limits or {}).get("image")
    if isinstance(entry, dict):
        size = (int(entry["width"]), int(entry["height"])) if entry.get("width") and entry.get("height") else None
        return (int(entry["count"]) if entry.get("count") is not None else None), size
    return (int(entry) if isinstance(entry, (int, float)) else None), None


def _max_model_len(text: str) -> int:
    """vLLM accepts 32k / 1M style lengths too."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid max model len {text!r}") from None


def _human_int(text: str) -> int:
    """vLLM reads byte counts like 16G, 512M or 1.5G too (decimal multipliers, as its parser)."""
    t = text.strip()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(t[-1:].lower(), 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid byte count {text!r}") from None


def expand_config_file(argv: Sequence[str]) -> list[str]:
    """Replace `--config FILE` by the flags it holds (explicit flags after it still win)."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        path = None
        if a == "--config" and i + 1 < len(args):
            path, i = args[i + 1], i + 2
        elif a.startswith("--config="):
            path, i = a.split("=", 1)[1], i + 1
        else:
            out.append(a)
            i += 1
            continue
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise UserError(f"cannot read --config {path}: {e}") from None
        if not isinstance(data, dict):
            raise UserError(f"--config {path}: expected a mapping of flag names to values")
        out = mapping_to_flags(data) + out
    return out


@dataclass(frozen=True)
class EngineConfig:
    """The flags resolved against the model and GPU (vLLM's own defaults filled in)."""

    gmu: float
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    chunked_prefill: bool
    prefix_caching: bool
    weight_bytes: float           # per parameter of the Linear layers (and routed experts)
    embedding_bytes: float        # per parameter of the token embedding and lm_head
    compute_dtype: str            # bf16 | fp8 | int8 (matmul dtype)
    kv_dtype_bytes: float
    tp: int
    pp: int
    dp: int
    ep: bool
    block_size: int
    enforce_eager: bool
    async_scheduling: bool
    kv_cache_memory_bytes: int | None
    quantization: str | None
    kv_cache_dtype: str
    max_cudagraph_capture_size: int | None = None   # None: vLLM's own, min(2 x max-num-seqs, 512)
    long_prefill_token_threshold: int = 0           # 0: off; else the per-step chunk of one prompt when others wait
    optimization_level: int = 2                     # 0: eager, 1: piecewise graphs only, 2 and 3: full graphs
    # multimodal (a VLM's profile has `vision`): images per prompt (None: vLLM's default, 999), the size
    # --limit-mm-per-prompt announces, --mm-processor-kwargs, and the encoder's flags
    mm_image_limit: int | None = None
    mm_image_size: tuple[int, int] | None = None
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    mm_encoder_tp_mode: str = "weights"
    disable_chunked_mm_input: bool = False
    skip_mm_profiling: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def images_enabled(self) -> bool:
        """--limit-mm-per-prompt with 0 images: vLLM leaves the vision encoder out."""
        return self.mm_image_limit != 0


def resolve(ns: argparse.Namespace, profile: ModelProfile, gpu: GPU) -> EngineConfig:
    """vLLM's defaults for this GPU and model (arg_utils: larger batch defaults on >= 70 GiB GPUs
    not named A100; max model len from the config)."""
    seqs_default, batched_default = (1024, 8192) if gpu.large_defaults else (256, 2048)
    if ns.performance_mode == "throughput":   # vLLM: throughput mode doubles the defaults it fills in
        seqs_default, batched_default = 2 * seqs_default, 2 * batched_default
    max_model_len = ns.max_model_len or profile.max_position
    seqs = ns.max_num_seqs or seqs_default
    batched = ns.max_num_batched_tokens
    if batched is None:
        batched = batched_default if ns.enable_chunked_prefill else max(max_model_len, batched_default)
    wbytes, ebytes, compute = _weights(ns, profile, gpu)
    kv = ns.kv_cache_dtype
    if kv in ("auto", "bfloat16", "float16"):
        kv_bytes = 4.0 if ns.dtype in ("float", "float32") else 2.0
    else:
        kv_bytes = 1.0
    return EngineConfig(
        gmu=ns.gpu_memory_utilization, max_num_seqs=seqs, max_num_batched_tokens=batched,
        max_model_len=max_model_len, chunked_prefill=ns.enable_chunked_prefill,
        prefix_caching=ns.enable_prefix_caching, weight_bytes=wbytes, embedding_bytes=ebytes,
        compute_dtype=compute,
        kv_dtype_bytes=kv_bytes, tp=ns.tensor_parallel_size, pp=ns.pipeline_parallel_size,
        dp=ns.data_parallel_size, ep=ns.enable_expert_parallel, block_size=ns.block_size,
        enforce_eager=ns.enforce_eager, async_scheduling=ns.async_scheduling,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes, quantization=ns.quantization, kv_cache_dtype=kv,
        max_cudagraph_capture_size=ns.max_cudagraph_capture_size,
        long_prefill_token_threshold=max(0, ns.long_prefill_token_threshold or 0),
        optimization_level=ns.optimization_level,
        **_multimodal(ns),
    )


def _multimodal(ns: argparse.Namespace) -> dict[str, Any]:
    limit, size = image_limit(getattr(ns, "limit_mm_per_prompt", None))
    return dict(mm_image_limit=limit, mm_image_size=size,
                mm_processor_kwargs=dict(getattr(ns, "mm_processor_kwargs", None) or {}),
                mm_encoder_tp_mode=getattr(ns, "mm_encoder_tp_mode", "weights"),
                disable_chunked_mm_input=bool(getattr(ns, "disable_chunked_mm_input", False)),
                skip_mm_profiling=bool(getattr(ns, "skip_mm_profiling", False)))


def _weights(ns: argparse.Namespace, profile: ModelProfile, gpu: GPU) -> tuple[float, float, str]:
    """(bytes per Linear weight, bytes per embedding/lm_head weight, matmul dtype). Quantization
    changes the Linear layers only (see _QUANT_INCLUDES_EMBEDDINGS), so the embeddings keep the model
    dtype's width."""
    model_bytes = 4.0 if ns.dtype in ("float", "float32") else 2.0
    embed_bytes = model_bytes
    if ns.quantization:
        nbytes, compute = _QUANT[ns.quantization]
        if ns.quantization in _QUANT_INCLUDES_EMBEDDINGS:
            embed_bytes = nbytes
    elif profile.native_dtype == "fp8":
        nbytes, compute = 1.0, "fp8"
    elif model_bytes == 4.0:
        nbytes, compute = 4.0, "fp32"
    else:
        nbytes, compute = 2.0, "bf16"
    if compute == "fp8" and not gpu.fp8_tflops:
        compute = "bf16"  # Ampere: FP8 weights, dequantized into BF16 matmuls (Marlin)
    return nbytes, embed_bytes, compute


def build_vllm_parser(prog: str = "api_server.py") -> argparse.ArgumentParser:
    """A parser that holds only vLLM's flags (for `unknown_flags` checks and the prior)."""
    p = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    add_vllm_arguments(p)
    return p


def parse_vllm_flags(flags: Sequence[str]) -> argparse.Namespace:
    """Parse vLLM flags; a flag vLLM would reject raises UserError with argparse's one line."""
    p = build_vllm_parser()
    args = expand_config_file(list(flags))

    def fail(message: str) -> Any:
        raise UserError(f"{p.prog}: error: {message}")

    p.error = fail  # type: ignore[method-assign]
    return p.parse_args(args)


def known_flags() -> set[str]:
    """Every `--flag` spelling the simulator accepts (including --no- forms)."""
    p = build_vllm_parser()
    out: set[str] = set()
    for action in p._actions:
        out.update(s for s in action.option_strings if s.startswith("--"))
    return out
