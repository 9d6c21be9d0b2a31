"""How sure a median regret is: for each scenario and method of a results JSON (run.py's output), the
median regret at 20 trials with a 95 % interval from resampling the seeds (bootstrap, 2,000 draws),
and the share of seeds where new-default's export beat random's, tied with it, or lost.

    .venv/bin/python benchmarks/search/medians.py benchmarks/search/results-100-seeds.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path


def interval(xs: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    print(f"{doc['command']} ({doc['date']})")
    for name, res in doc["scenarios"].items():
        print(f"\n{name}")
        for method, m in res["methods"].items():
            xs = m.get("regret_20_seeds")
            if not xs:
                continue
            lo, hi = interval(xs)
            print(f"  {method}: median {statistics.median(xs):.2%} [{lo:.2%}, {hi:.2%}], "
                  f"mean {statistics.mean(xs):.2%}, {len(xs)} seeds")
        a, b = res["methods"].get("new-default", {}), res["methods"].get("random", {})
        if a.get("regret_20_seeds") and b.get("regret_20_seeds"):
            pairs = list(zip(a["regret_20_seeds"], b["regret_20_seeds"]))
            won = sum(x < y - 1e-9 for x, y in pairs)
            tied = sum(abs(x - y) <= 1e-9 for x, y in pairs)
            print(f"  new-default vs random, seed by seed: less regret {won}, equal {tied}, "
                  f"more {len(pairs) - won - tied}")


if __name__ == "__main__":
    main(sys.argv[1])
