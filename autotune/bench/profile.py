"""Describe a workload: what a person checks before trusting a tuning result made with it.

Length distributions (log2 histograms and percentiles), arrivals over time (rate per bin, peak against
mean, the coefficient of variation of inter-arrival gaps: 1 for Poisson, above 1 bursty; 1/CV^2 is the
gamma shape that `--burstiness` takes), conversations, and the share of prompt tokens that repeat an
earlier request's prefix in whole 16-token blocks (what a prefix cache could serve at most). Computed
from the prompts a run would send, before any is sent; printed by `bench`, stored with a study, shown by
`show`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from autotune.bench.tokens import Tokenizer
from autotune.bench.trace.fields import TokenCounter
from autotune.bench.trace.prefix import BLOCK, shared_prefix_share
from autotune.bench.workloads import Prompt

RATE_BINS = 24
_SPARK = "▁▂▃▄▅▆▇█"


def _lengths(values: Sequence[int]) -> dict[str, Any]:
    arr = np.asarray(values, dtype=float)
    top = int(arr.max())
    edges = [1 << k for k in range(max(1, top).bit_length())]     # [1, 2), [2, 4), ... up to the top value
    counts = np.histogram(arr, bins=edges + [edges[-1] * 2])[0]
    hist = [[lo, 2 * lo, int(c)] for lo, c in zip(edges, counts)]
    while hist and hist[0][2] == 0:
        hist.pop(0)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": top,
            "hist": hist}


def _arrivals(times: Sequence[float]) -> dict[str, Any] | None:
    t = np.sort(np.asarray(times, dtype=float))
    span = float(t[-1] - t[0])
    if len(t) < 2 or span <= 0:
        return None
    gaps = np.diff(t)
    cv = float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else math.inf
    bin_s = span / RATE_BINS
    counts = np.histogram(t, bins=RATE_BINS, range=(t[0], t[-1]))[0]
    mean_rate = (len(t) - 1) / span
    return {"span_s": span, "mean_rate": mean_rate, "bin_s": bin_s, "counts": [int(c) for c in counts],
            "peak_rate": float(counts.max() / bin_s), "peak_to_mean": float(counts.max() / bin_s / mean_rate),
            "interarrival_cv": cv, "gamma_shape": (1.0 / cv**2) if cv > 0 else None}


def describe(prompts: Sequence[Prompt], tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The profile of `prompts` (one pass of a trace, or a sample of a synthetic workload)."""
    if not prompts:
        return {"requests": 0}

    counter = TokenCounter(tokenizer)
    roles: dict[str, int] = {}

    def units(p: Prompt) -> list[int]:
        """Token ids (words without a tokenizer); chat messages each encoded once, a separator before each."""
        if not p.messages:
            return list(counter.ids(p.text))
        out: list[int] = []
        for m in p.messages:
            out.append(-1 - roles.setdefault(m["role"], len(roles)))
            out += counter.ids(m["content"])
        return out

    seqs = [units(p) for p in prompts]
    n_in = [p.input_tokens if p.input_tokens else sum(1 for u in s if u >= 0) for p, s in zip(prompts, seqs)]
    convs: dict[str, int] = {}
    for p in prompts:
        if p.conversation is not None:
            convs[p.conversation] = convs.get(p.conversation, 0) + 1
    out: dict[str, Any] = {
        "requests": len(prompts), "input_tokens": _lengths([max(1, n) for n in n_in]),
        "output_tokens": _lengths([p.output_len for p in prompts]),
        "conversations": len(convs), "turns_per_conversation": (sum(convs.values()) / len(convs)) if convs else None,
        "prefix_share_pct": 100.0 * shared_prefix_share(seqs, BLOCK), "prefix_block": BLOCK,
        "counted_with": "tokenizer" if tokenizer is not None else "words",
    }
    times = [p.at_s for p in prompts if p.at_s is not None]
    if len(times) == len(prompts):
        out["arrivals"] = _arrivals(times)
    images = _images(prompts)
    if images:
        out["images"] = images
    return out


def _images(prompts: Sequence[Prompt]) -> dict[str, Any] | None:
    """How many requests carry images, how many each, and the commonest sizes."""
    carrying = [p for p in prompts if p.images]
    if not carrying:
        return None
    sizes: dict[str, int] = {}
    for p in carrying:
        for img in p.images:
            key = f"{img.width}x{img.height}"
            sizes[key] = sizes.get(key, 0) + 1
    counts = [len(p.images) for p in carrying]
    return {"requests_pct": 100.0 * len(carrying) / len(prompts), "per_image_request": sum(counts) / len(counts),
            "max_per_request": max(counts), "sizes": dict(sorted(sizes.items(), key=lambda kv: -kv[1])[:8])}


def _spark(values: Sequence[float]) -> str:
    top = max(values) if values else 0
    if top <= 0:
        return ""
    return "".join(_SPARK[min(len(_SPARK) - 1, int(len(_SPARK) * v / top))] if v else " " for v in values)


def format_profile(d: dict[str, Any]) -> str:
    """A few lines for `bench` and `show`."""
    if not d or not d.get("requests"):
        return "workload: no requests"
    # profiles stored before "sample" was: every workload but a trace was described by a sample
    sample = d.get("sample", d.get("workload", {}).get("kind") not in (None, "trace"))
    head = f"workload: a sample of {d['requests']} requests" if sample else f"workload: {d['requests']} requests"
    if d.get("conversations"):
        head += f", {d['conversations']} multi-turn conversations ({d['turns_per_conversation']:.1f} turns each)"
    a = d.get("arrivals")
    if a:
        head += f", over {a['span_s']:.1f} s at {a['mean_rate']:.2f} req/s"
    lines = [head]
    for key, name in (("input_tokens", "input tokens "), ("output_tokens", "output tokens")):
        x = d[key]
        lines.append(f"  {name} p50 {x['p50']:.0f}  p90 {x['p90']:.0f}  p99 {x['p99']:.0f}  max {x['max']}  "
                     f"log2 histogram from {x['hist'][0][0] if x['hist'] else 1}: {_spark([h[2] for h in x['hist']])}")
    if a:
        shape = "bursty" if a["interarrival_cv"] > 1.2 else "Poisson-like" if a["interarrival_cv"] > 0.8 else "even"
        lines.append(f"  rate per {a['bin_s']:.2g} s: {_spark(a['counts'])}  peak {a['peak_rate']:.2f} req/s "
                     f"({a['peak_to_mean']:.1f}x mean); inter-arrival CV {a['interarrival_cv']:.2f} ({shape})")
    lines.append(f"  prompt tokens repeating an earlier request's prefix: {d['prefix_share_pct']:.1f} % "
                 f"(whole {d['prefix_block']}-token blocks, counted in {d['counted_with']})")
    im = d.get("images")
    if im:
        lines.append(f"  images: {im['requests_pct']:.0f} % of requests carry {im['per_image_request']:.2f} on average "
                     f"(at most {im['max_per_request']}); sizes " + ", ".join(f"{k} x{v}" for k, v in im["sizes"].items()))
    return "\n".join(lines)
