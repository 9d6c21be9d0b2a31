"""Writes benchmarks/sim_calibration.md: the simulator beside the articles' measured tables
(REFERENCE.md §5) and the real H200 run (§2b), at the same settings, with the in-process simulator.

    .venv/bin/python benchmarks/sim_calibration.py [--out benchmarks/sim_calibration.md]

Deterministic (no noise); takes ~20 s on the 2-core reference machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from autotune.perfmodel import plan
from autotune.perfmodel import roofline as rf
from autotune.perfmodel.memory import RUNTIME_BASE_GIB
from autotune.sim.inprocess import run

WORK = dict(input_len=1024, output_len=256, range_ratio=0.5, seed=0)
SHAPED_8B = str(Path(__file__).resolve().parent / "gpu" / "llama8b-shaped-config.json")
FP8, FP8_KV, NO_PREFIX = ["--quantization", "fp8"], ["--kv-cache-dtype", "fp8"], ["--no-enable-prefix-caching"]
# The second real H200 run (benchmarks/gpu/quality/h200-llama8b-quality.db, vLLM 0.24.0): label, flags,
# weights GiB, KV tokens, batch-1 p50 TPOT ms, p99 TTFT ms at concurrency 16, the capacity C it ran at.
QUALITY_RUN = [
    ("#0 BF16 defaults", [], 13.49, 933_616, 4.78, 418, 40),
    ("#1 FP8 weights", FP8, 7.03, 986_896, 3.27, 291, 54),
    ("#2 FP8 + FP8 KV", FP8 + FP8_KV, 7.03, 1_973_792, 3.35, 348, 58),
    ("#7 GMU 0.97, FP8 + FP8 KV, seqs 91, batched 30843", ["--gpu-memory-utilization", "0.97", "--max-num-seqs", "91",
     "--max-num-batched-tokens", "30843"] + NO_PREFIX + FP8 + FP8_KV, 7.03, 2_047_952, 3.40, 332, 58),
    ("#8 GMU 0.97, FP8 KV, seqs 105, batched 32269", ["--gpu-memory-utilization", "0.97", "--max-num-seqs", "105",
     "--max-num-batched-tokens", "32269"] + NO_PREFIX + FP8_KV, 13.52, 1_940_624, 4.88, 410, 39),
]


def sim(model: str, flags: list[str], gpu: str, n: int, conc: int, reqs: int = 600, warmup: int | None = None,
        **kw: object) -> dict:
    """One closed-loop run; the first min(conc, 100) completions are warm-up unless `warmup` says."""
    p = plan(model, flags, gpu, n)
    if not p.budget.fits:
        return {"fits": False, "reason": p.budget.reason.splitlines()[0]}
    args = {**WORK, **kw}
    warm = min(conc, 100) if warmup is None else warmup
    r = run(p, num_requests=reqs, warmup=warm, concurrency=conc, **args)  # type: ignore[arg-type]
    m = r.metrics
    return {"fits": True, "tps": m["output_throughput"], "ttft50": m["median_ttft_ms"], "ttft99": m["p99_ttft_ms"],
            "tpot": m["median_tpot_ms"], "oom": r.oom, "kv_tokens": p.budget.kv_cache_tokens,
            "kv_gib": p.budget.kv_gib, "weights": p.budget.weights_gib}


def pct(sim_v: float, ref: float) -> str:
    d = (sim_v - ref) / ref * 100
    return f"{d:+.0f} %" + ("" if abs(d) <= 20 else " (outside 20 %)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).with_name("sim_calibration.md")))
    out_path = Path(ap.parse_args().out)
    t0 = time.time()
    L: list[str] = []
    L.append("# Simulator calibration: the twin beside the articles' and the reference machine's figures\n")
    L.append("Produced by `.venv/bin/python benchmarks/sim_calibration.py` (in-process simulator, no noise, "
             "seed 0). Article figures (REFERENCE.md §5) are claims, not ground truth; the H200 rows (§2b) are "
             "real measurements. Workload unless said: random prompts 1024 in / 256 out with lengths drawn "
             "+-50 % (the articles give 1K prompts and no output length; the seed-002 calculator defaults to "
             "1024/256), closed loop at the stated concurrency. Efficiency constants: "
             f"`autotune/perfmodel/roofline.py` (HBM {rf.BW_EFFICIENCY:.0%}, MFU {rf.MFU:.0%} BF16 / {rf.FP8_MFU:.0%} "
             f"FP8, {rf.FP8_GEMM_S * 1e6:.1f} us per FP8 GEMM, fixed step overheads).\n")

    # 1. KV tokens
    L.append("## 1. KV-cache tokens, GLM-5.3-Flash on 8 x A800, TP8, max-model-len 1,048,576 (seed 001)\n")
    L.append("| GMU | max-num-seqs | article tokens | sim tokens | diff | article KV GiB/card | sim KV GiB/card | sim graphs GiB |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for gmu, seqs, ref, ref_gib in (("0.90", "256", 1_535_933, 18.39), ("0.95", "32", 2_004_983, 22.4)):
        b = plan("glm-5.3-flash", ["-tp", "8", "--max-model-len", "1048576", "--gpu-memory-utilization", gmu,
                                   "--max-num-seqs", seqs], "A800", 8).budget
        L.append(f"| {gmu} | {seqs} | {ref:,} | {b.kv_cache_tokens:,} | {pct(b.kv_cache_tokens, ref)} | {ref_gib} | "
                 f"{b.kv_gib:.2f} | {b.graphs_gib:.2f} |")
    L.append("\nThe profile is CALIBRATED to these two rows (architecture not public; see its notes): per-token "
             "bytes and reserved memory are fitted to the token counts. The article's per-card KV GiB cannot "
             "both hold: 18.39 -> 22.4 GiB is x1.22 while its tokens grow x1.31, so the GiB column differs. "
             "Weights 39.8 GiB/card match; at TP4 the weights alone exceed a card, as the article says.\n")

    # 2. 9B max-num-seqs sweep
    L.append("## 2. GLM-4.6V-9B BF16 on 1 x H100, max-num-seqs sweep (seed 003 §3.3)\n")
    L.append("Client concurrency 256 (the article's load threads), max-model-len 32768, max-num-batched-tokens 32768.\n")
    L.append("| max-num-seqs | article tok/s | sim tok/s | diff | sim TTFT p50 / p99 ms | sim TPOT p50 ms |")
    L.append("| --- | --- | --- | --- | --- | --- |")
    for seqs, ref in ((32, 2900), (64, 4300), (128, 4850), (256, 4900)):
        r = sim("glm-4.6v-9b", ["--max-model-len", "32768", "--max-num-seqs", str(seqs), "--max-num-batched-tokens",
                                "32768"], "H100", 1, 256, reqs=800)
        L.append(f"| {seqs} | {ref} | {r['tps']:.0f} | {pct(r['tps'], ref)} | {r['ttft50']:.0f} / {r['ttft99']:.0f} | "
                 f"{r['tpot']:.1f} |")
    L.append("\nTrend: throughput gains flatten past 128 sequences (prefill compute saturates the GPU) while per-token "
             "latency keeps rising. Low max-num-seqs rows come out low: reaching the article's 2,900 tok/s at 32 "
             "sequences would need the prefill of 1K prompts to cost almost nothing, beyond a 60 % MFU roofline.\n")

    # 3. GMU sweep
    L.append("## 3. GLM-4.6V-9B, gpu-memory-utilization at concurrency 64 (seed 003 §3.2)\n")
    L.append("| GMU | article KV GB | sim KV GiB | article tok/s | sim tok/s | diff | sim runtime OOM |")
    L.append("| --- | --- | --- | --- | --- | --- | --- |")
    for gmu, ref_kv, ref in (("0.80", 35, 4200), ("0.92", 48, 4850), ("0.98", 52, 4900)):
        r = sim("glm-4.6v-9b", ["--max-model-len", "32768", "--max-num-seqs", "128", "--max-num-batched-tokens",
                                "32768", "--gpu-memory-utilization", gmu], "H100", 1, 64)
        L.append(f"| {gmu} | ~{ref_kv} | {r['kv_gib']:.1f} | {ref} | {r['tps']:.0f} | {pct(r['tps'], ref)} | "
                 f"{'yes: ' + r['oom'][:60] + '...' if r['oom'] else 'no'} |")
    L.append("\nNot matched by design: at 64 sequences of ~1.3K tokens the KV demand is ~6.5 GB, far below even the "
             "0.80 budget, so a faithful model shows no throughput gain from a larger KV pool (the article's "
             "4,200 -> 4,850 must come from something it does not describe). What the twin does reproduce: "
             "0.98 leaves ~1.6 GiB outside the budget, less than the "
             f"{RUNTIME_BASE_GIB:.2f} GiB (plus prefill temporaries) a busy engine was measured to use past its budget "
             "on the real H200 (section 5b), so it dies under load (runtime OOM) while 0.92 does not; the article saw "
             "'occasional OOM' there.\n")

    # 4. final 9B + MoE layout
    L.append("## 4. Seed 003 final table (1K prompt)\n")
    L.append("| scenario | article tok/s | sim tok/s | diff | sim tok/s, 512 out | article TTFT s | sim TTFT p50 / p99 s |")
    L.append("| --- | --- | --- | --- | --- | --- | --- |")
    base9 = ["--max-model-len", "32768", "--max-num-seqs", "128", "--max-num-batched-tokens", "32768"]
    rows = [("9B BF16 TP1 @64", "glm-4.6v-9b", base9, 1, 64, 4850, 0.45),
            ("9B BF16 TP1 @128", "glm-4.6v-9b", base9, 1, 128, 4920, 0.72)]
    moe = ["--quantization", "fp8", "--max-model-len", "32768", "--max-num-seqs", "256"]
    rows += [("106B FP8 TP4+EP2 @96", "glm-4.6v-106b", moe + ["-tp", "4", "-dp", "2", "--enable-expert-parallel"], 8, 96, 11200, 0.92),
             ("106B FP8 TP4+EP2 @128", "glm-4.6v-106b", moe + ["-tp", "4", "-dp", "2", "--enable-expert-parallel"], 8, 128, 11800, 1.35),
             ("106B FP8 TP8 @128", "glm-4.6v-106b", moe + ["-tp", "8"], 8, 128, 9800, 1.10)]
    moe_tps = {}
    for label, model, flags, n, conc, ref, ref_ttft in rows:
        r = sim(model, flags, "H100", n, conc)
        r512 = sim(model, flags, "H100", n, conc, output_len=512)
        moe_tps[label] = r["tps"]
        L.append(f"| {label} | {ref} | {r['tps']:.0f} | {pct(r['tps'], ref)} | {r512['tps']:.0f} | {ref_ttft} | "
                 f"{r['ttft50'] / 1e3:.2f} / {r['ttft99'] / 1e3:.2f} |")
    tp4 = moe_tps["106B FP8 TP4+EP2 @128"]
    tp8 = moe_tps["106B FP8 TP8 @128"]
    L.append(f"\nTrend: TP4+EP2 beats TP8 at 128 by {(tp4 / tp8 - 1) * 100:.0f} % (article: 20 %): expert "
             "parallelism keeps each 1408-wide expert whole on one GPU (TP8 slices it into 176 columns, thin GEMMs "
             "that stream weights below bandwidth) and halves the all-reduce group. TTFTs are lower than the "
             "article's: the twin's closed loop has no network, tokenizer or multimodal preprocessing.\n")
    p = plan("glm-4.6v-106b", moe + ["-tp", "4", "-dp", "2", "--enable-expert-parallel"], "H100", 8)
    per_gpu = (p.budget.weights_gib * 2**30) / 3.35e12
    L.append(f"Why the absolute MoE rows stay ~35-45 % low (not fixed): at 96 sequences every step routes 768 "
             f"token-expert picks over 128 experts, so each GPU streams its whole {p.budget.weights_gib:.1f} GiB FP8 "
             f"shard every step ({per_gpu * 1e3:.1f} ms at 100 % of 3.35 TB/s; a pure-decode bound of "
             f"{96 / per_gpu:,.0f} tok/s). The twin adds 80 % bandwidth efficiency (measured on the real H200, "
             "section 5), TP all-reduce and EP all-to-all latency per layer (~1.6 ms a step), fixed step overheads "
             "(~1.2 ms), FP8 GEMM costs (~0.6 ms a step, fitted on the real H200, section 5b) and compute-bound "
             "prefill steps, which lands at ~6-7.5k. The article's figure implies smaller "
             "per-step costs than the twin's, whose constants were calibrated on dense models; no MoE-specific "
             "fit was made. The 9B rows are sensitive to the unstated output length (the 512-out column).\n")
    L.append("FP8 frees memory for KV (106B on 8 x H100, TP8, max-model-len 32768):\n")
    for q in ([], ["--quantization", "fp8"]):
        b = plan("glm-4.6v-106b", ["-tp", "8", "--max-model-len", "32768"] + q, "H100", 8).budget
        L.append(f"- {'FP8' if q else 'BF16'} weights: {b.weights_gib:.1f} GiB/GPU, KV {b.kv_gib:.1f} GiB/GPU, "
                 f"{b.kv_cache_tokens:,} tokens")
    L.append("")

    # 5. real H200
    L.append("## 5. Real vLLM 0.24 on an H200: Llama-3.1-8B-shaped random model, max-model-len 4096 (REFERENCE §2b)\n")
    b = plan(SHAPED_8B, ["--max-model-len", "4096"], "H200", 1).budget
    L.append(f"KV tokens: measured 933,616, sim {b.kv_cache_tokens:,} ({pct(b.kv_cache_tokens, 933_616)}); "
             f"weights measured 13.49 GiB, sim {b.weights_gib:.2f} GiB.\n")
    L.append("| concurrency | measured tok/s | sim tok/s | diff | measured TTFT p50 ms | sim TTFT p50 ms | measured TPOT ms | sim TPOT ms |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for conc, ref, ref_ttft, ref_tpot in ((1, 200, 34, 4.73), (64, 3298, 701, 13.6), (256, 4677, None, None)):
        r = sim(SHAPED_8B, ["--max-model-len", "4096"], "H200", 1, conc, reqs=max(64, 3 * conc), output_len=128,
                range_ratio=0.0)
        L.append(f"| {conc} | {ref} | {r['tps']:.0f} | {pct(r['tps'], ref)} | {ref_ttft or '-'} | {r['ttft50']:.0f} | "
                 f"{ref_tpot or '-'} | {r['tpot']:.2f} |")
    L.append("\nFixed lengths 1024/128 as measured. The real run's TTFT at 64 (701 ms) includes a closed loop whose "
             "first wave of 64 prompts arrives at once; the twin shows the same wave (p99) but a lower median.\n")

    # 5b. the second real H200 run: FP8 and GMU 0.97
    L.append("## 5b. Second real H200 run (vLLM 0.24.0, same shape): FP8 weights, FP8 KV, GMU 0.97\n")
    L.append("As `benchmarks/gpu/report.py` runs it: fixed lengths 1024/128, closed loop, first wave measured; "
             "TPOT from 20 requests at concurrency 1, p99 TTFT from 160 at 16, the OOM column from 160 at the "
             "real capacity C. GMU 0.92 unless said; #7/#8 without prefix caching.\n")
    L.append("| trial | weights GiB real / sim | KV tokens real / sim | diff | batch-1 TPOT ms real / sim | diff | "
             "p99 TTFT ms @16 real / sim | diff | sim runtime OOM at C |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, flags, w, kv, tpot, ttft, cap in QUALITY_RUN:
        f = ["--max-model-len", "4096", *flags]
        one = sim(SHAPED_8B, f, "H200", 1, 1, reqs=20, warmup=0, output_len=128, range_ratio=0.0)
        c16 = sim(SHAPED_8B, f, "H200", 1, 16, reqs=160, warmup=0, output_len=128, range_ratio=0.0)
        at_c = sim(SHAPED_8B, f, "H200", 1, cap, reqs=160, warmup=0, output_len=128, range_ratio=0.0)
        L.append(f"| {label} | {w:.2f} / {one['weights']:.2f} | {kv:,} / {one['kv_tokens']:,} | {pct(one['kv_tokens'], kv)} | "
                 f"{tpot:.2f} / {one['tpot']:.2f} | {pct(one['tpot'], tpot)} | {ttft} / {c16['ttft99']:.0f} | "
                 f"{pct(c16['ttft99'], ttft)} | {'yes' if at_c['oom'] else 'no'} (C={cap}) |")
    L.append("\nFP8 weights keep the embedding and lm_head in BF16 (2 x 131,072,000 params), within 1 % of the "
             "measured 7.03 GiB; one byte per parameter gave 6.74. Batch-1 FP8 decode reaches only ~52-55 % of "
             "the HBM floor against "
             "BF16's ~70 %: the twin charges each FP8 GEMM a fixed cost (dynamic activation quantization and a "
             "scaled-mm launch), and runs FP8 prefill at a lower fraction of its (2x) peak, so FP8 prefill is "
             "~1.3x faster than BF16, as measured. Prefill stays ~20 % too fast in both dtypes (TTFT column; "
             "benchmarks/gpu/RESULTS.md §6), so the twin's capacity at a 1 s p99 TTFT is still optimistic. Both "
             "GMU 0.97 configurations ran in reality (peak 139.0 / 140.4 GiB); the runtime-OOM rule is fitted to "
             "this run's memory peaks.\n")

    # 6. not simulated
    L.append("## 6. Figures the twin does not reproduce, and why\n")
    single = sim("glm-5.3-flash", ["-tp", "8", "--max-model-len", "1048576", "--gpu-memory-utilization", "0.95",
                                   "--max-num-seqs", "32"], "A800", 8, 1, reqs=8)
    L.append(f"- GLM-5.3-Flash single stream on 8 x A800: article 61.9 -> 72.2 tok/s (v7) and 79.0 (v8), both with "
             f"5 MTP speculative tokens; the twin has no speculative decoding and gives {single['tps']:.0f} tok/s "
             "(kernel efficiency 0.35 on Ampere, calibrated: sm_80 runs FP8 MoE through fallback kernels).")
    b = plan("glm-5.3-flash", ["--max-model-len", "32768"], "A800", 1).budget
    L.append(f"- Seed 000's single-A800 GLM-5.3-Flash table (180-640 tok/s): 320B parameters need {b.weights_gib:.0f} "
             "GiB of weights even at 1 byte each; they cannot fit one 80 GB card, so those figures must describe "
             "a different (smaller) model. The twin reports it as a startup OOM.")
    L.append("- Prefix caching's '-40 % TTFT from the second turn, +15 % throughput' needs the article's multi-turn "
             "workload (unknown); the twin models prefix hits (block-hash cache, LRU in free KV) but no row is "
             "claimed.\n")
    L.append(f"_Generated in {time.time() - t0:.0f} s on the 2-core reference machine, {time.strftime('%Y-%m-%d')}._")
    out_path.write_text("\n".join(L) + "\n")
    print(out_path.read_text())


if __name__ == "__main__":
    main()
