#!/usr/bin/env python3
"""Load steps per trial, before and after the capacity search bounded its growth by the evidence of its met
steps (issue 22, item 5; bench/step_bounds.py). SIMULATED: every started point of a landscape (the twin's
curves, landscape.py) is searched once with each search (`Landscape.run(evidence=False)` is the search
before), with the same 5 % measurement noise and seed, from the probe (a study's first trial) and from the
hint a study's second trial gets (the baseline's bracket, capped at the candidate's max-num-seqs).

    .venv/bin/python benchmarks/search/steps.py [--json benchmarks/search/steps.json]
    .venv/bin/python benchmarks/search/steps.py --hint-fallback   # -> steps-hint-down.json

`--hint-fallback` compares instead, from the hint and with the evidence-bounded growth, what follows a
hinted first step that breaks: the probe at once (before) or a step at 3/4 of the hint first (after,
`step_choice.BELOW_HINT`).

Per row: trials searched; steps and broken steps per trial (median, mean, share with at most two broken);
load seconds per trial by the H200 cost model (cost.py: probe, full step, step cut short); the capacity
found against the point's true capacity (the highest load meeting the SLO on the noise-free curve: the
mean shortfall, and the share found within 3 % of it); brackets still wider than 25 % (`wide_bracket`).
A point whose curve meets the SLO up to its last stored load has no known truth (the MoE's tp4-dp2 points:
their stored curves end flat at 256 streams, an artefact of the landscape) and is left out of the accuracy
and bracket columns (`no truth`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from autotune.bench.capacity import study_hint  # noqa: E402
from autotune.bench.step_choice import BELOW_HINT, DESCENT, is_wide  # noqa: E402
from cost import fit  # noqa: E402
from landscape import load  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402
from trials import Landscape, Trial  # noqa: E402

# (row name, scenario, SLO replacing the scenario's): the long-prompt curves hold p50 TPOT at every load,
# so the same landscape also serves the case of a TPOT bound beside the TTFT one
CASES = (("dense-1gpu", "dense-1gpu", None), ("moe-8gpu", "moe-8gpu", None), ("long-prompt", "long-prompt", None),
         ("long-prompt, TPOT bound", "long-prompt", "ttft:p99<=3s,tpot:p50<=25ms"))


def truth(land: Landscape, point: dict[str, Any]) -> int | None:
    top = max(s["c"] for s in point["curve"])
    best = 0
    for c in range(1, int(top) + 1):
        _, ttft, tpot, oom = land.at_load(point["curve"], c)
        if oom or max(v / limit - 1 for _, v, limit in land.terms(ttft, tpot).values()) > 0:
            break
        best = c
    return best if best < top else None


def summarize(trials: list[tuple[Trial, int | None]], cost: Any) -> dict[str, Any]:
    steps = [len(t.loads) for t, _ in trials]
    broken = [t.broken_steps for t, _ in trials]
    seconds = [cost.probe_s * t.probed + cost.full_step_s * (t.full_steps - t.probed)
               + cost.aborted_step_s * t.aborted_steps for t, _ in trials]
    found = [(t.bracket[0], tr) for t, tr in trials if t.bracket[0] and tr]
    return {"trials": len(trials), "steps_median": statistics.median(steps), "steps_mean": statistics.mean(steps),
            "broken_median": statistics.median(broken), "broken_mean": statistics.mean(broken),
            "broken_at_most_2": sum(b <= 2 for b in broken) / len(broken),
            "load_s_mean": statistics.mean(seconds),
            "shortfall_mean": statistics.mean((tr - lo) / tr for lo, tr in found),
            "within_3pct": sum(abs(tr - lo) / tr <= 0.03 for lo, tr in found) / len(found),
            "wide": sum(is_wide(((t.bracket[0], 0.0), (t.bracket[1], 0.0) if t.bracket[1] else None), True, 1024.0, 0.25)
                        for t, tr in trials if t.bracket[0] and tr),
            "no_truth": sum(1 for _, tr in trials if not tr)}


def run_case(name: str, scenario: str, slo: str | None, cost: Any, hint_fallback: bool = False) -> dict[str, Any]:
    land = Landscape(load(scenario), SCENARIOS[scenario], slo)
    points = [p for p in land.points.values() if p["start"] == "ok" and not land.cotenant_refuses(p["params"])]
    out: dict[str, Any] = {"slo": str(land.slo), "points": len(points)}
    # (start, evidence, below_hint, descent, row's search label)
    variants = ([("hinted", True, None, None, "probe at once"),
                 ("hinted", True, BELOW_HINT, None, "3/4 of the hint first"),
                 ("hinted", True, BELOW_HINT, DESCENT, "3/4 then halving")]
                if hint_fallback else
                [(start, evidence, BELOW_HINT, DESCENT, "after" if evidence else "before")
                 for start in ("probe", "hinted") for evidence in (False, True)])
    for start, evidence, below, descent, label in variants:
        base = land.run(land.space.baseline_params(), random.Random(1), evidence=evidence)
        trials = []
        for i, p in enumerate(points):
            seqs = p["params"].get("max_num_seqs")
            hint = study_hint([base.bracket], seqs if isinstance(seqs, int) else None) if start == "hinted" else None
            trials.append((land.run(p["params"], random.Random(i), hint=hint, evidence=evidence, below_hint=below,
                                    descent=descent),
                           truth(land, p)))
        out[f"{start}, {label}"] = summarize(trials, cost)
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["| scenario (SLO) | start | search | trials | steps median / mean | broken median / mean | "
             "<= 2 broken | load s / trial | shortfall (mean) | within 3 % | wide | no truth |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, res in doc["cases"].items():
        for key, m in res.items():
            if not isinstance(m, dict):
                continue
            start, search = key.split(", ")
            lines.append(f"| {name} ({res['slo']}) | {start} | {search} | {m['trials']} | {m['steps_median']:g} / "
                         f"{m['steps_mean']:.2f} | {m['broken_median']:g} / {m['broken_mean']:.2f} | "
                         f"{m['broken_at_most_2']:.0%} | {m['load_s_mean']:.1f} | {m['shortfall_mean']:.2%} | "
                         f"{m['within_3pct']:.0%} | {m['wide']} | {m['no_truth']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--hint-fallback", action="store_true")
    args = ap.parse_args()
    args.json = args.json or str(Path(__file__).resolve().parent
                                 / ("steps-hint-down.json" if args.hint_fallback else "steps.json"))
    cost = fit()
    t0 = time.time()
    doc: dict[str, Any] = {"command": " ".join(["benchmarks/search/steps.py", *sys.argv[1:]]), "simulated": True,
                           "machine": f"{platform.node()} {os.cpu_count()} cores (shared)",
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "cost_model": vars(cost), "cases": {}}
    for name, scenario, slo in CASES:
        doc["cases"][name] = run_case(name, scenario, slo, cost, args.hint_fallback)
        print(f"{name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))


if __name__ == "__main__":
    main()
