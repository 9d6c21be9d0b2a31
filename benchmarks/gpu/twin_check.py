"""The twin against the GPU's first runs: for every measured trial of the study DBs given, the twin's
capacity_tps for the same flags, model shape, GPU, workload and SLO, beside the measurement. The twin
is what ranks the warm start's picks, so its error and its rank correlation on real runs are what
decide whether those picks are worth their launches.

    python3 benchmarks/gpu/twin_check.py [--per-trial] DB...      # DBs gunzipped from benchmarks/gpu/knobs

The model is the 8B shape of benchmarks/gpu/make_model.py (its config only: the twin needs no weights).
Prints, per study and over all: the trials, the median and mean abs log ratio measured / predicted, the
worst, and Spearman's rho between measured and predicted. Simulated figures throughout.

By default the twin runs its own capacity search under the study's SLO, as the warm start ranks: an error
there mixes how fast the twin thinks a config runs with where it thinks the SLO breaks.
`--at-measured` asks only the first: the twin's tok/s at the streams the real search ended at.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.perfmodel import plan                            # noqa: E402
from autotune.sim.capacity import at_capacity, capacity_curve, step   # noqa: E402
from autotune.slo import SLO                                    # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_model import SHAPE                                    # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **SHAPE, "torch_dtype": "bfloat16",
          "tie_word_embeddings": False}


def _gpu(hardware: dict[str, Any]) -> str:
    name = (hardware.get("gpus") or [{}])[0].get("name", "")
    return "H200" if "H200" in name else "H100" if "H100" in name else name


def trials(db: str) -> tuple[str, list[dict[str, Any]]]:
    """The study's name and its measured first runs with what the twin needs."""
    with sqlite3.connect(db) as c:
        name, fixed, slo, spec = c.execute("select name, fixed_flags, slo, spec from autotune_studies").fetchone()
        spec = json.loads(spec)
        out = []
        for number, flags, objectives, hardware, capacity in c.execute(
                "select number, flags, objectives, hardware, capacity from autotune_trials "
                "where state = 'ok' and simulated = 0 order by number"):
            value = json.loads(objectives or "{}").get("capacity_tps")
            if value:
                out.append({"number": number, "flags": [*json.loads(fixed), *json.loads(flags)],
                            "measured": float(value), "gpu": _gpu(json.loads(hardware or "{}")),
                            "slo": slo, "workload": spec["workload"],
                            "requests": int(spec["load"].get("requests_per_step") or 96),
                            "streams": int(json.loads(capacity or "{}").get("capacity") or 0)})
    return name, out


def predict(model: str, t: dict[str, Any], at_measured: bool = False) -> float | None:
    """The twin's capacity_tps for trial `t`, with the requests per step the warm start gives it."""
    p = plan(model, t["flags"], t["gpu"], 1)
    w = t["workload"]
    if at_measured:
        return float(step(p, t["streams"], int(w["input_len"]), int(w["output_len"]), min(t["requests"], 96))["tps"])
    best = at_capacity(capacity_curve(p, SLO.parse(t["slo"]), int(w["input_len"]), int(w["output_len"]),
                                      min(t["requests"], 96)))
    return float(best["tps"]) if best else None


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for k, i in enumerate(order):
            r[i] = float(k)
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1)) if n > 1 else float("nan")


def summary(label: str, rows: list[tuple[float, float]]) -> str:
    logs = [abs(math.log(m / p)) for m, p in rows]
    return (f"| {label} | {len(rows)} | {statistics.median(logs):.3f} | {statistics.mean(logs):.3f} | "
            f"{max(logs):.3f} | {spearman([m for m, _ in rows], [p for _, p in rows]):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dbs", nargs="+")
    ap.add_argument("--per-trial", action="store_true")
    ap.add_argument("--at-measured", action="store_true", help="the twin's tok/s at the measured streams")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as model:
        Path(model, "config.json").write_text(json.dumps(CONFIG))
        print("| study | trials | median abs log(measured / twin) | mean | worst | Spearman rho |")
        print("|---|---|---|---|---|---|")
        every: list[tuple[float, float]] = []
        for db in args.dbs:
            name, ts = trials(db)
            rows = []
            for t in ts:
                p = predict(model, t, args.at_measured)
                if args.per_trial:
                    print(f"  {name} #{t['number']}: measured {t['measured']:.0f}, twin {p or 0:.0f}", file=sys.stderr)
                if p:
                    rows.append((t["measured"], p))
            every += rows
            print(summary(f"{name} ({ts[0]['gpu'] if ts else '?'})", rows))
        print(summary("all", every))


if __name__ == "__main__":
    main()
