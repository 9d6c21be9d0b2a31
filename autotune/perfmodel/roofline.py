"""How long one scheduler step takes on the simulated GPUs (REFERENCE.md §4):

    step = roofline(bytes / bandwidth, FLOPs / compute) + TP all-reduce + EP all-to-all + overheads

computed for one data-parallel replica (vLLM keeps MoE DP replicas in lockstep, so every replica takes
the same step). Bytes are the weights a step touches (MoE: only experts some token routed to) plus the
KV of every scheduled sequence; FLOPs are 2 x active params per token plus attention.

The efficiency constants are calibrated against the articles' measured tables; see
benchmarks/sim_calibration.md for the fit and where it falls short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.perfmodel.config import EngineConfig
from autotune.perfmodel.gpus import GPU
from autotune.perfmodel.memory import dense_weight_bytes, expert_weight_bytes, graph_capture_max, vision_weight_bytes
from autotune.perfmodel.profiles import ModelProfile

BW_EFFICIENCY = 0.80       # achieved HBM fraction streaming weights and KV (real H200 run: TPOT 4.73 ms at batch 1)
MFU = 0.75                 # achieved fraction of peak tensor FLOPs in large GEMMs (real H200 run at concurrency 256)
LINK_EFFICIENCY = 0.70     # achieved fraction of NVLink bandwidth in collectives
STEP_OVERHEAD_S = 1.6e-3   # scheduler, sampling, input prep per step (CUDA graphs on)
PER_SEQ_OVERHEAD_S = 6e-6  # per scheduled sequence (sampling, detokenizing, output processing)
EAGER_LAUNCH_S = 30e-6     # per layer kernel launches when a step runs without CUDA graphs
PIECEWISE_S = 6e-6         # per layer: attention runs outside the captured graph in mixed steps
THIN_EXPERT_COLS = 512     # expert GEMMs with fewer output columns per GPU run below bandwidth
PP_BUBBLE = 0.30           # extra time per extra pipeline stage
# FP8 matmuls (W8A8: --quantization fp8 or an FP8 checkpoint on FP8 tensor cores). Real vLLM 0.24 on an
# H200, 32k-vocab Llama-8B shape: batch-1 TPOT 4.78 ms in BF16 but 3.27-3.40 ms in FP8, although FP8
# streams half the bytes. No shared bandwidth/overhead pair fits both (it would need 4.9 TB/s, above the
# H200's 4.8 peak): each FP8 GEMM pays a fixed cost, dynamic per-tensor activation quantization (a
# max-reduction and a quantize kernel) and a scaled-mm launch. Prefill: p99 TTFT at concurrency 16 was
# 410-418 ms in BF16 and 291-348 ms in FP8, ~1.3x faster, not the 2x of the FP8 peak.
FP8_GEMMS_PER_LAYER = 4    # qkv, o, gate_up, down
FP8_GEMM_S = 3.2e-6        # per FP8 GEMM per step (fit: mean batch-1 TPOT of 5 real FP8 trials, 3.35 ms)
FP8_MFU = 0.49             # achieved fraction of peak FP8 FLOPs (fit: FP8/BF16 prefill speed 1.3x)
# A vision encoder is a small transformer (hidden 1280 in Qwen2.5-VL) over a few thousand patches per image,
# with windowed attention and per-image kernels: its GEMMs are far thinner than the language model's
# prefill. An assumption, not a fit: the H200 study's per-class TTFT is what checks it.
ENCODER_MFU = 0.35


@dataclass
class StepCost:
    seconds: float
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


class StepModel:
    """Step durations for one (model, flags, GPU) triple; cheap to call once per simulated step."""

    def __init__(self, profile: ModelProfile, cfg: EngineConfig, gpu: GPU):
        self.profile, self.cfg, self.gpu = profile, cfg, gpu
        eff = profile.kernel_efficiency.get(gpu.arch, 1.0)
        self.bandwidth = gpu.hbm_tbps * 1e12 * BW_EFFICIENCY * eff
        self.fp8 = cfg.compute_dtype == "fp8" and gpu.fp8_tflops is not None
        self.flops = gpu.peak_flops(cfg.compute_dtype) * (FP8_MFU if self.fp8 else MFU) * eff
        self.encoder_flops_rate = gpu.peak_flops("bf16") * ENCODER_MFU * eff
        tp, pp = cfg.tp, cfg.pp
        self.dense_bytes = dense_weight_bytes(profile, cfg)
        self.ep = cfg.ep and profile.is_moe
        self.expert_bytes = expert_weight_bytes(profile, cfg)
        if profile.is_moe and not self.ep:
            cols = profile.moe_intermediate_size / tp
            self.expert_bytes /= min(1.0, math.sqrt(cols / THIN_EXPERT_COLS))
        self.kv_bpt = profile.kv_bytes_per_token_per_gpu(tp, pp, cfg.kv_dtype_bytes)
        self.active_flops_per_token = 2 * profile.active_params / (tp * pp)
        attn_width = profile.num_heads * (profile.head_dim + profile.qk_rope_head_dim)
        self.attn_flops_per_ctx = 4 * profile.num_layers / pp * attn_width / tp
        self.layers = profile.num_layers / pp
        self.fp8_gemm_s = FP8_GEMM_S * FP8_GEMMS_PER_LAYER * self.layers if self.fp8 else 0.0
        self.vision_bytes = vision_weight_bytes(profile, cfg)
        self.encoder_split = tp if cfg.mm_encoder_tp_mode == "weights" else 1
        self.max_graph = graph_capture_max(cfg)
        # -O1 captures piecewise graphs only: attention runs outside them in every step, not only in
        # mixed prefill steps (-O2, the default, and -O3 add full graphs for pure decode steps)
        self.piecewise_only = cfg.optimization_level == 1

    def _touched(self, routed_tokens: float) -> float:
        """Fraction of the experts on a GPU that at least one of `routed_tokens` tokens picks."""
        p = self.profile
        if not p.is_moe or routed_tokens <= 0:
            return 0.0 if p.is_moe else 1.0
        return 1.0 - (1.0 - p.experts_per_token / p.num_experts) ** routed_tokens

    def _allreduce(self, tokens: float) -> float:
        tp = self.cfg.tp
        if tp == 1 or tokens <= 0:
            return 0.0
        msg = tokens * self.profile.hidden_size * 2
        link = self.gpu.link_gbps * 1e9 * LINK_EFFICIENCY
        latency = self.gpu.link_latency_us * 1e-6 * (1 + 0.15 * (tp - 1))
        return 2 * self.layers * (2 * (tp - 1) / tp * msg / link + latency)

    def _alltoall(self, tokens: float) -> float:
        if not self.ep or tokens <= 0:
            return 0.0
        ranks = self.cfg.tp * self.cfg.dp
        p = self.profile
        msg = tokens * p.experts_per_token * p.hidden_size * 2 * (ranks - 1) / ranks / self.cfg.tp
        link = self.gpu.link_gbps * 1e9 * LINK_EFFICIENCY * 0.85
        moe_layers = p.moe_layers / self.cfg.pp
        return 2 * moe_layers * (msg / link + 2 * self.gpu.link_latency_us * 1e-6)

    def step(self, num_seqs: int, new_tokens: int, ctx_tokens: float, attn_ctx: float,
             prefill: bool, encoder_flops: float = 0.0) -> StepCost:
        """One step for the whole engine: `num_seqs` scheduled sequences with `new_tokens` tokens in
        all, `ctx_tokens` KV tokens read, `attn_ctx` = sum over new tokens of their context length,
        `encoder_flops` the vision encoder's work on the images whose tokens start in this step (it runs
        before the language model's forward, on the same GPUs). Divided evenly over DP replicas."""
        if num_seqs <= 0 or new_tokens <= 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        dp = self.cfg.dp
        tokens = new_tokens / dp
        routed = new_tokens if self.ep else tokens
        bytes_read = self.dense_bytes + self.expert_bytes * self._touched(routed) + ctx_tokens / dp * self.kv_bpt
        memory_s = bytes_read / self.bandwidth
        compute_s = (tokens * self.active_flops_per_token + attn_ctx / dp * self.attn_flops_per_ctx) / self.flops
        if encoder_flops > 0:   # the encoder streams its own weights once and runs its matmuls in 16-bit
            memory_s += self.vision_bytes / self.bandwidth
            compute_s += encoder_flops / dp / self.encoder_split / self.encoder_flops_rate
        comm_s = self._allreduce(tokens) + self._alltoall(tokens)
        overhead = (STEP_OVERHEAD_S * (0.6 if self.cfg.async_scheduling else 1.0) + PER_SEQ_OVERHEAD_S * num_seqs / dp
                    + self.fp8_gemm_s)
        if self.max_graph == 0 or (not prefill and num_seqs / dp > self.max_graph):
            overhead += EAGER_LAUNCH_S * self.layers
        elif prefill or self.piecewise_only:
            overhead += PIECEWISE_S * self.layers
        core = max(memory_s, compute_s) + 0.10 * min(memory_s, compute_s)
        total = (core + comm_s) * (1 + PP_BUBBLE * (self.cfg.pp - 1)) + overhead
        return StepCost(total, compute_s, memory_s, comm_s, overhead)

    def decode_step(self, batch: int, context: int) -> StepCost:
        return self.step(batch, batch, batch * context, batch * context, False)

    def prefill_time(self, prompt: int) -> float:
        """One prompt prefilled alone, chunked by max-num-batched-tokens."""
        chunk = self.cfg.max_num_batched_tokens if self.cfg.chunked_prefill else prompt
        done, total = 0, 0.0
        while done < prompt:
            n = min(chunk, prompt - done)
            total += self.step(1, n, done + n, n * (done + n / 2), True).seconds
            done += n
        return total
