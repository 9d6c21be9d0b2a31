"""`estimate --pd 1p1d`: what a prefill/decode split is predicted to give beside a single instance, from
the in-process twin, so that a person can see when a split could pay before spending GPUs on it.

At each concurrency c of a closed loop (c users, each sending its next request when the last one ends):
- the decode pool (M instances) holds c/M streams each, every prompt's KV handed over (only its last
  token computed there): its TPOT, and its first token's time once a request arrives;
- the request rate is c / (TTFT + (out - 1) x TPOT), the TTFT depending on the rate (found by bisection);
- the prefill pool (N instances) gets that rate / N as Poisson arrivals of one-token requests: its TTFT;
- the split's TTFT is prefill TTFT + the KV hand-off (perfmodel/disagg.py) + the decode's first token.
Medians add up as an approximation (p50 of a sum is not the sum of p50s). Output tok/s on both sides is
c x output / (TTFT + (output - 1) x TPOT) from the medians, so it differs from the curve's figures (the
in-process run's own, which count a short run's drain). Every figure is SIMULATED.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from autotune.errors import UserError
from autotune.pdlayout import PDLayout
from autotune.perfmodel.disagg import HOST_STAGING_GBPS, LINK_EFFICIENCY, TRANSFER_OVERHEAD_S, transfer
from autotune.perfmodel.predict import Plan
from autotune.sim.inprocess import run

_LABEL = re.compile(r"(\d+)p(\d+)d")
CONCURRENCIES = (1, 4, 16, 32, 64, 128)
BISECTION_STEPS = 7     # the sustained rate to within 1/128 of its bracket


def parse_layout(text: str) -> PDLayout:
    """`1p1d`, `2p1d` ... -> PDLayout; a one-line UserError otherwise."""
    m = _LABEL.fullmatch(text.strip().lower())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise UserError(f"--pd {text!r}: give a split like 1p1d, 2p1d or 1p2d (prefill and decode instances)")
    return PDLayout(int(m.group(1)), int(m.group(2)))


def _one(plan: Plan, c: int, input_len: int, output_len: int, **kw: Any) -> dict[str, float]:
    n = max(3 * c, 48)
    return run(plan, num_requests=n, warmup=min(c, 32), input_len=input_len, output_len=output_len,
               range_ratio=0.5, **kw).metrics


def split_row(plan: Plan, layout: PDLayout, c: int, input_len: int, output_len: int) -> dict[str, Any]:
    """The single instance's and the split's figures at concurrency c (closed loop)."""
    single = _one(plan, c, input_len, output_len, concurrency=c)
    hand = transfer(plan, input_len, layout.kv_buffer_device).seconds
    dec = _one(plan, max(1, math.ceil(c / layout.decode)), input_len, output_len,
               concurrency=max(1, math.ceil(c / layout.decode)), prefilled=True)
    tpot = dec["median_tpot_ms"] / 1e3
    first_decode = dec["median_ttft_ms"] / 1e3
    rest = hand + first_decode + max(output_len - 1, 0) * tpot     # a request's time after its prefill

    def prefill_at(rate: float) -> dict[str, float]:
        return _one(plan, c, input_len, 1, request_rate=rate / layout.prefill)

    # the rate that the loop sustains: rate = c / (prefill TTFT at that rate + the rest); the right side
    # falls as the rate rises, so bisection finds the one crossing
    lo, hi = 0.0, c / (rest + _one(plan, 1, input_len, 1, concurrency=1)["median_ttft_ms"] / 1e3)
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if mid < c / (prefill_at(mid)["median_ttft_ms"] / 1e3 + rest):
            lo = mid
        else:
            hi = mid
    rate = max(lo, 1e-6)
    pre = prefill_at(rate)
    ttft = pre["median_ttft_ms"] / 1e3 + hand + first_decode
    # tok/s by Little's law for both sides, so that they compare (the single run's own throughput counts
    # its drain at the end of a short run; the split's rate has none)
    single_cycle = (single["median_ttft_ms"] + max(output_len - 1, 0) * single["median_tpot_ms"]) / 1e3
    return {"concurrency": c,
            "single": {"output_tps": round(c * output_len / single_cycle, 1),
                       "p50_ttft_ms": round(single["median_ttft_ms"], 1),
                       "p50_tpot_ms": round(single["median_tpot_ms"], 2)},
            "split": {"output_tps": round(rate * output_len, 1), "p50_ttft_ms": round(ttft * 1e3, 1),
                      "p50_tpot_ms": round(tpot * 1e3, 2), "prefill_ttft_ms": round(pre["median_ttft_ms"], 1),
                      "transfer_ms": round(hand * 1e3, 3)}}


def split_report(plan: Plan, layout: PDLayout, input_len: int, output_len: int,
                 concurrencies: Sequence[int] = CONCURRENCIES) -> dict[str, Any]:
    """The split's section of `estimate`: its GPUs, the hand-off's bytes and time, and rows per concurrency
    (those the single instance's KV cache can hold)."""
    moved = transfer(plan, input_len, layout.kv_buffer_device)
    b, cfg = plan.budget, plan.config
    limit = max(1, min(cfg.max_num_seqs * cfg.dp, int(b.kv_cache_tokens * cfg.dp / (input_len + output_len))))
    return {
        "layout": layout.label, "prefill_instances": layout.prefill, "decode_instances": layout.decode,
        "gpus": layout.instances * cfg.world_size, "connector": "NixlConnector",
        "kv_buffer_device": layout.kv_buffer_device,
        "kv_bytes_per_request_per_gpu": round(moved.bytes_per_gpu), "transfer_ms": round(moved.seconds * 1e3, 3),
        "link_gbps_effective": round(moved.link_gbps, 1),
        "assumption": (f"KV over the GPU link ({plan.gpu.name}: {plan.gpu.link_gbps:g} GB/s one direction per GPU) "
                       f"at {LINK_EFFICIENCY:.0%} efficiency, +{TRANSFER_OVERHEAD_S * 1e3:g} ms a hand-off"
                       + (f"; host staging at {HOST_STAGING_GBPS:g} GB/s" if layout.kv_buffer_device == "cpu" else "")
                       + "; not measured"),
        "rows": [split_row(plan, layout, c, input_len, output_len) for c in concurrencies if c <= limit],
    }


def render_split(pd: dict[str, Any], input_len: int) -> list[str]:
    """The split's lines of `estimate`'s text, the single instance's figures beside the split's."""
    name = f"{pd['prefill_instances']}P+{pd['decode_instances']}D"
    lines = [f"SIMULATED prefill/decode split {name} ({pd['layout']}, {pd['gpus']} GPUs, {pd['connector']}): "
             f"a {input_len}-token prompt moves {pd['kv_bytes_per_request_per_gpu'] / 2**20:.1f} MiB per GPU "
             f"in ~{pd['transfer_ms']:.2f} ms",
             f"  assumption: {pd['assumption']}",
             "  tok/s for both: concurrency x output / (TTFT + (output - 1) x TPOT), from the medians",
             f"  concurrency | single: tok/s  TTFT p50 ms  TPOT p50 ms | {name}: tok/s  TTFT p50 ms  TPOT p50 ms"]
    for r in pd["rows"]:
        s, p = r["single"], r["split"]
        lines.append(f"  {r['concurrency']:>11} | {s['output_tps']:>12.0f}  {s['p50_ttft_ms']:>11.1f}  "
                     f"{s['p50_tpot_ms']:>11.2f} | {p['output_tps']:>{len(name) + 7}.0f}  {p['p50_ttft_ms']:>11.1f}  "
                     f"{p['p50_tpot_ms']:>11.2f}")
    return lines
