"""`autotune estimate`: the articles' "Inference Lab" calculator as a command. The memory budget per
GPU, KV tokens and concurrency, roofline decode/prefill times, and a throughput-latency curve from
the in-process simulator (closed loop at rising concurrency)."""

from __future__ import annotations

from typing import Any, Sequence

from autotune.perfmodel.memory import GiB, encoder_profile, max_tokens_per_image, vision_weight_bytes
from autotune.perfmodel.predict import Plan
from autotune.perfmodel.roofline import StepModel
from autotune.pdlayout import PDLayout
from autotune.sim.inprocess import ImageMix, run
from autotune.sim.split import render_split, split_report


def vision_report(plan: Plan, images: ImageMix | None) -> dict[str, Any] | None:
    """A VLM's side of the budget: the encoder's weights, vLLM's encoder profiling, and what the workload's
    images cost (tokens each, encoder time, the KV a request with them takes)."""
    v, cfg = plan.profile.vision, plan.config
    if v is None:
        return None
    enc = encoder_profile(plan.profile, cfg)
    out: dict[str, Any] = {
        "family": v.family, "params": round(v.params), "images_enabled": cfg.images_enabled,
        "weights_gib_per_gpu": round(vision_weight_bytes(plan.profile, cfg) / GiB, 3),
        "max_tokens_per_image": max_tokens_per_image(plan.profile, cfg),
        "profiled_images": enc.items if enc else 0,
        "profile_peak_gib": round(enc.peak_bytes / GiB, 3) if enc else 0.0,
    }
    if images is not None and cfg.images_enabled:
        m = StepModel(plan.profile, cfg, plan.gpu)
        w, h = images.sizes[0]
        kw = cfg.mm_processor_kwargs
        per_image = v.tokens(w, h, kw)
        flops = v.flops(v.patches(w, h, kw))
        out["image"] = {"width": w, "height": h, "tokens": per_image, "encoder_patches": v.patches(w, h, kw),
                        "encoder_ms": round(flops / m.encoder_flops_rate / m.encoder_split * 1e3, 3),
                        "images_per_request": images.count[1], "share": images.share}
    return out


def estimate_report(plan: Plan, input_len: int, output_len: int, curve: bool = True,
                    images: ImageMix | None = None, pd: Sequence[PDLayout] = ()) -> dict[str, Any]:
    """Everything `estimate` says, as one JSON-able mapping; `pd`: prefill/decode splits to predict
    beside this single instance (sim/split.py)."""
    b, cfg = plan.budget, plan.config
    out: dict[str, Any] = {
        "simulated": True, "gpu": plan.gpu.name, "num_gpus": plan.num_gpus, "model_profile": plan.profile.name,
        "fits": b.fits, "cause": b.cause, "reason": b.reason,
        "weights_gib_per_gpu": round(b.weights_gib, 3), "activation_gib_per_gpu": round(b.activation_gib, 3),
        "non_torch_gib_per_gpu": round(b.non_torch_gib, 3), "graphs_gib_per_gpu": round(b.graphs_gib, 3),
        "kv_gib_per_gpu": round(b.kv_gib, 3), "requested_gib_per_gpu": round(b.requested_gib, 3),
        "total_gib_per_gpu": b.total_gib, "kv_bytes_per_token_per_gpu": round(b.kv_bytes_per_token, 1),
        "kv_cache_tokens": b.kv_cache_tokens, "max_concurrency": round(b.max_concurrency, 2),
        "max_model_len": cfg.max_model_len, "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens, "gpu_memory_utilization": cfg.gmu,
        "tensor_parallel_size": cfg.tp, "pipeline_parallel_size": cfg.pp, "data_parallel_size": cfg.dp,
        "enable_expert_parallel": cfg.ep, "weight_bytes_per_param": cfg.weight_bytes,
        "kv_dtype_bytes": cfg.kv_dtype_bytes, "calibrated_fields": list(plan.profile.calibrated),
        "profile_notes": plan.profile.notes,
    }
    vision = vision_report(plan, images)
    if vision is not None:
        out["vision"] = vision
    if not b.fits:
        return out
    m = StepModel(plan.profile, cfg, plan.gpu)
    ctx = input_len + output_len // 2
    single = m.decode_step(1, ctx)
    out["roofline"] = {
        "input_len": input_len, "output_len": output_len,
        "prefill_ms": round(m.prefill_time(input_len) * 1e3, 2),
        "decode_step_ms_batch1": round(single.seconds * 1e3, 3),
        "decode_bound_batch1": single.bound,
        "single_stream_tok_s": round(1.0 / single.seconds, 1),
        "decode_step_ms_by_batch": {str(n): round(m.decode_step(n, ctx).seconds * 1e3, 3)
                                    for n in (1, 8, 32, 64, 128, 256) if n <= cfg.max_num_seqs * cfg.dp},
    }
    if curve:
        points = []
        limit = min(cfg.max_num_seqs * cfg.dp * 2, max(1, int(b.kv_cache_tokens * cfg.dp / (input_len + output_len))) * 2)
        for c in (1, 4, 16, 32, 64, 96, 128, 192, 256, 384, 512):
            if c > max(limit, 1):
                break
            r = run(plan, num_requests=max(3 * c, 48), warmup=min(c, 32), input_len=input_len,
                    output_len=output_len, concurrency=c, range_ratio=0.5, images=images)
            mt = r.metrics
            points.append({"concurrency": c, "output_tps": round(mt["output_throughput"], 1),
                           "p50_ttft_ms": round(mt["median_ttft_ms"], 1), "p99_ttft_ms": round(mt["p99_ttft_ms"], 1),
                           "p50_tpot_ms": round(mt["median_tpot_ms"], 2), "preemptions": r.preemptions,
                           "runtime_oom": r.oom is not None,
                           **{f"p99_ttft_ms_{c}": round(mt[f"{c}_p99_ttft_ms"], 1) for c in ("image", "text")
                              if f"{c}_p99_ttft_ms" in mt}})
            if r.oom:
                break
        out["curve"] = points
    if pd:
        out["pd"] = [split_report(plan, layout, input_len, output_len) for layout in pd]
    return out


def render_text(r: dict[str, Any]) -> str:
    lines = [f"SIMULATED estimate: {r['model_profile']} on {r['num_gpus']} x {r['gpu']} "
             f"(TP {r['tensor_parallel_size']}, PP {r['pipeline_parallel_size']}, DP {r['data_parallel_size']}"
             f"{', EP' if r['enable_expert_parallel'] else ''})",
             f"memory per GPU (GiB): total {r['total_gib_per_gpu']:.2f}, requested {r['requested_gib_per_gpu']:.2f} "
             f"(GMU {r['gpu_memory_utilization']})",
             f"  weights {r['weights_gib_per_gpu']:.2f} | activations {r['activation_gib_per_gpu']:.2f} | "
             f"non-torch {r['non_torch_gib_per_gpu']:.2f} | graphs {r['graphs_gib_per_gpu']:.2f} | "
             f"KV {r['kv_gib_per_gpu']:.2f}",
             f"KV cache: {r['kv_cache_tokens']:,} tokens ({r['kv_bytes_per_token_per_gpu']:.0f} B/token/GPU); "
             f"maximum concurrency for {r['max_model_len']:,} tokens per request: {r['max_concurrency']:.2f}x"]
    vis = r.get("vision")
    if vis:
        lines.append(f"vision encoder ({vis['family']}): {vis['params'] / 1e9:.2f}B params, {vis['weights_gib_per_gpu']:.2f} "
                     f"GiB per GPU; at most {vis['max_tokens_per_image']:,} tokens per image; profiled with "
                     f"{vis['profiled_images']} image(s) of that size (peak {vis['profile_peak_gib']:.2f} GiB)"
                     if vis["images_enabled"] else "vision encoder: not loaded (--limit-mm-per-prompt allows no image)")
        im = vis.get("image")
        if im:
            lines.append(f"an image of {im['width']}x{im['height']}: {im['tokens']:,} tokens of context "
                         f"({im['encoder_patches']:,} encoder patches, ~{im['encoder_ms']} ms of encoder); "
                         f"{im['images_per_request']} per request on {im['share'] * 100:.0f} % of requests")
    if not r["fits"]:
        lines.append(f"DOES NOT START ({r['cause']}): {r['reason'].splitlines()[-1]}")
    if "roofline" in r:
        rf = r["roofline"]
        lines.append(f"roofline: prefill {rf['input_len']} tokens {rf['prefill_ms']} ms; decode step (batch 1) "
                     f"{rf['decode_step_ms_batch1']} ms, {rf['decode_bound_batch1']}-bound, "
                     f"~{rf['single_stream_tok_s']} tok/s single stream")
    if r.get("curve"):
        lines.append(f"throughput-latency curve (closed loop, {r['roofline']['input_len']} in / "
                     f"{r['roofline']['output_len']} out):")
        split = any("p99_ttft_ms_image" in p for p in r["curve"])
        lines.append("  concurrency  output tok/s  TTFT p50 ms  TTFT p99 ms  TPOT p50 ms"
                     + ("  TTFT p99 image / text ms" if split else ""))
        for p in r["curve"]:
            lines.append(f"  {p['concurrency']:>11}  {p['output_tps']:>12.0f}  {p['p50_ttft_ms']:>11.0f}  "
                         f"{p['p99_ttft_ms']:>11.0f}  {p['p50_tpot_ms']:>11.2f}"
                         + (f"  {p.get('p99_ttft_ms_image', float('nan')):>10.0f} / {p.get('p99_ttft_ms_text', float('nan')):.0f}"
                            if split else "")
                         + ("  runtime OOM" if p["runtime_oom"] else ""))
    for pd in r.get("pd", []):
        lines += render_split(pd, r["roofline"]["input_len"])
    if r["calibrated_fields"]:
        lines.append(f"note: profile fields calibrated to article figures: {', '.join(r['calibrated_fields'])}")
    return "\n".join(lines) + "\n"
