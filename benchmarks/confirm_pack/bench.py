"""A study's confirmation on 1 slot against 3 free slots (issue 22: its rounds are leased jobs).

SIMULATED: the labelled twin (`autotune sim-serve`) serves the study of `sim_spec()` in tests/conftest.py
(Llama-3.1-8B on one simulated H100, the launchable two-knob space), at --time-scale. First the study's
trials run without confirmation (`--no-confirm`); then two copies of that database are confirmed by the
same `autotune run` command (no new trial is needed, so only the confirmation runs), one with one slot
(`--gpus 0 --parallel 1`: round after round) and one with three (`--gpus 0-2 --parallel 3`: the three
rounds at once, each round's pair on one slot). The confirmation's wall time is read from its rows (first
repeat's start to last repeat's end); the command's own wall time is recorded beside it.

    python benchmarks/confirm_pack/bench.py --out benchmarks/confirm_pack/results-dev-2core.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.conftest import SIM_STUDY  # noqa: E402  (the simulator study the tests use)


def _run(args: list[str], cwd: Path) -> float:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return time.monotonic() - t0


def _window(db: Path) -> tuple[float, int, list[tuple[int, list[int]]], dict[int, float]]:
    """(first start to last end, repeats, (round, slots) pairs, each round's summed repeat seconds)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select round, lease, started_at, finished_at from autotune_confirmations").fetchall()
    start = min(dt.datetime.fromisoformat(r[2]) for r in rows)
    end = max(dt.datetime.fromisoformat(r[3]) for r in rows)
    slots = sorted({(r[0], tuple(json.loads(r[1])["slots"])) for r in rows})
    rounds: dict[int, float] = {}
    for r in rows:
        took = (dt.datetime.fromisoformat(r[3]) - dt.datetime.fromisoformat(r[2])).total_seconds()
        rounds[r[0]] = round(rounds.get(r[0], 0.0) + took, 1)
    return (end - start).total_seconds(), len(rows), [(r, list(s)) for r, s in slots], rounds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time-scale", type=float, default=5.0)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--top", type=int, default=2, help="candidates confirmed beside the baseline")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/autotune-confirm-pack"))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    spec: dict[str, Any] = json.loads(json.dumps(SIM_STUDY))
    spec.update(name="pack", storage=f"sqlite:///{args.workdir / 'pack.db'}",
                confirm={"enabled": True, "top_k": args.top, "repeats": 3})
    spec["engine"]["time_scale"] = args.time_scale
    spec_path = args.workdir / "pack.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    base = ["run", "--study", str(spec_path), "--n-trials", str(args.trials), "--no-progress"]
    trials_s = _run([*base, "--no-confirm"], args.workdir)
    results = {}
    for label, gpus, parallel in (("one-slot", "0", 1), ("three-slots", "0-2", 3)):
        db = args.workdir / f"{label}.db"
        shutil.copy(args.workdir / "pack.db", db)
        command_s = _run([*base, "--storage", f"sqlite:///{db}", "--gpus", gpus, "--parallel", str(parallel)],
                         args.workdir)
        window, repeats, placement, rounds = _window(db)
        results[label] = {"gpus": gpus, "parallel": parallel, "confirmation_s": round(window, 1),
                          "command_s": round(command_s, 1), "repeats": repeats, "rounds_on_slots": placement,
                          "round_s": rounds}
        print(label, json.dumps(results[label]), flush=True)
    ratio = results["three-slots"]["confirmation_s"] / results["one-slot"]["confirmation_s"]
    # what packing alone would give if each round took on its own slot what it took on the one slot:
    # the longest round over the whole serial confirmation (the rest of the measured ratio is contention)
    serial = results["one-slot"]["round_s"]
    packing_only = max(serial.values()) / results["one-slot"]["confirmation_s"]
    body = {"simulated": True, "command": " ".join(sys.argv), "time_scale": args.time_scale,
            "trials": args.trials, "top_k": args.top, "trials_s": round(trials_s, 1), "results": results,
            "three_over_one": round(ratio, 3), "packing_only": round(packing_only, 3), "acceptance": "<= 0.45",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu_count": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}}
    args.out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"confirmation on 3 slots / on 1 slot: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
