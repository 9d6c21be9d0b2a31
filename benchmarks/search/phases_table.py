"""The startup-phase table of benchmarks/search/RESULTS.md: every real H200 vLLM log in the repository,
split by autotune/engine/phases.py (totals from the log; the fixture's 83 s is its measured launch time).

    .venv/bin/python benchmarks/search/phases_table.py
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.engine.phases import PHASES, startup_phases  # noqa: E402

FILES = [ROOT / "tests/fixtures/logs/gpu-vllm0.24-8b-ok.log",
         *sorted((ROOT / "benchmarks/gpu/quality/logs").glob("trial-*.gz")),
         *sorted((ROOT / "benchmarks/gpu/round2/device/logs").glob("*.gz")),
         *sorted((ROOT / "benchmarks/gpu/round2/device/corun").glob("server*.gz"))]


def main() -> None:
    print("| log | total s | " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for f in FILES:
        text = gzip.open(f, "rt").read() if f.suffix == ".gz" else f.read_text()
        p = startup_phases(text, 83.0 if f.name.endswith("8b-ok.log") else None)
        if p is None:
            continue
        name = str(f.relative_to(ROOT)).replace("benchmarks/gpu/", "")
        print(f"| {name} | {p['total']:.0f} | " + " | ".join(f"{p[k]:.1f}" for k in PHASES) + " |")


if __name__ == "__main__":
    main()
