"""`run` + `export` of the simulator study over several seeds (issue 27): does every seed end with a
config to deploy, and which one, on what verdict?

For each seed the study spec (default studies/sim-h100-9b.yaml) is copied into a fresh temporary folder
with its `seed:` set, its storage there and the engine's time scale as given (the spec's own by default),
then `autotune run --n-trials N --no-progress` (confirmation included, as a user runs it) and `autotune
export --format vllm-yaml` run as subprocesses of this checkout. Recorded per seed: both exit codes,
the wall time, the exported trial, the verdict lines of the export's header, and every confirmed
configuration (first run, confirmed median, spread, whether it stayed) from `show --json`.

    nice -n 10 timeout 3h .venv/bin/python benchmarks/export_seeds/run.py --seeds 0-9 [--time-scale 20]
    .venv/bin/python benchmarks/export_seeds/run.py --table      # the table of what results.json holds

Writes results.json beside this file (one entry per seed, merged with the entries already there, after
each seed) and prints a Markdown table for RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
AUTOTUNE = [sys.executable, "-m", "autotune"]


def seeds_of(text: str) -> list[int]:
    """'0-9' or '0,3,5' -> the seeds."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished children: `autotune run` and the servers it started."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one_seed(spec_path: Path, seed: int, n_trials: int, time_scale: float | None, timeout_s: float) -> dict[str, Any]:
    """Run and export one seed in a temporary folder; the figures that say what it exported and why."""
    raw = yaml.safe_load(spec_path.read_text())
    with tempfile.TemporaryDirectory(prefix=f"export-seed{seed}-") as tmp:
        work = Path(tmp)
        raw.update(seed=seed, storage=f"sqlite:///{work / 'study.db'}")
        if time_scale is not None:
            raw["engine"]["time_scale"] = time_scale
        spec = work / "study.yaml"
        spec.write_text(yaml.safe_dump(raw, sort_keys=False))
        started = time.monotonic()
        cpu0 = _children_cpu()
        try:
            run = subprocess.run([*AUTOTUNE, "run", "--study", str(spec), "--n-trials", str(n_trials), "--no-progress"],
                                 capture_output=True, text=True, cwd=work, env=ENV, timeout=timeout_s)
            run_rc, run_err = run.returncode, run.stderr
        except subprocess.TimeoutExpired:
            run_rc, run_err = 124, "timed out"
        entry = {"seed": seed, "run_rc": run_rc, "run_s": round(time.monotonic() - started, 1),
                 "run_cpu_s": round(_children_cpu() - cpu0, 1),
                 "run_stderr_tail": run_err.strip().splitlines()[-3:] if run_rc else []}
        return {**entry, **outcome(work, raw["storage"])}


def outcome(work: Path, url: str) -> dict[str, Any]:
    """`export` and `show --json` of the study at `url`: what was exported, on which verdict, and every
    confirmed configuration (first run, median, spread, whether it stayed)."""
    out = work / "best.yaml"
    exp = subprocess.run([*AUTOTUNE, "export", "--storage", url, "--format", "vllm-yaml", "-o", str(out)],
                         capture_output=True, text=True, cwd=work, env=ENV, timeout=120)
    shown = subprocess.run([*AUTOTUNE, "show", "--storage", url, "--json"], capture_output=True, text=True,
                           cwd=work, env=ENV, timeout=120)
    show = json.loads(shown.stdout) if shown.returncode == 0 else {}
    header = [line[2:] for line in out.read_text().splitlines() if line.startswith("# ")] if out.exists() else []
    wrote = re.search(r"trial (\d+)\)", exp.stdout)
    trials = {t["number"]: t for t in show.get("trials", [])}
    confirmations = []
    for n, c in sorted((show.get("confirmations") or {}).items(), key=lambda kv: int(kv[0])):
        first = (trials.get(int(n)) or {}).get("objectives", {}).get("capacity_tps")
        confirmations.append({"trial": int(n), "role": (trials.get(int(n)) or {}).get("role"),
                              "first_run_tps": first, "median_tps": c["medians"].get("capacity_tps"),
                              "spread": c["spreads"].get("capacity_tps"), "survives": c["survives"],
                              "why_not": c["why_not"], "quality_changing": c["quality_changing"],
                              "verdict": [v["text"] for v in c["verdict"]]})
    return {"export_rc": exp.returncode, "exported_trial": int(wrote.group(1)) if wrote else None,
            "export_message": (exp.stderr.strip() or exp.stdout.strip()).splitlines()[-1:] or [""],
            "header": [h for h in header if h.startswith(("confirmed", "against", "this is", "UNCONFIRMED",
                                                          "verdict", "WARNING"))],
            "confirmations": confirmations, "left_out": show.get("confirmation_left_out")}


def table(entries: list[dict[str, Any]]) -> str:
    rows = ["| seed | run | export | exported | verdict (header) | confirmed: first run -> median tok/s (spread) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for e in entries:
        conf = "; ".join(f"#{c['trial']}{' (baseline)' if c['role'] == 'baseline' else ''} "
                         f"{(c['first_run_tps'] or 0):,.0f} -> {(c['median_tps'] or 0):,.0f} ({(c['spread'] or 0):.1%})"
                         + ("" if c["survives"] else f" OUT: {c['why_not']}") for c in e["confirmations"])
        verdict = " / ".join(e["header"][1:] or e["header"] or e["export_message"])
        took = (f"{e['run_s']:.0f} s ({e['run_cpu_s']:.0f} s CPU)" if e.get("run_s") is not None
                else "cut from outside, resumed (see its note)")
        rows.append(f"| {e['seed']} | rc {e['run_rc']}, {took} | rc {e['export_rc']} | "
                    f"{'#' + str(e['exported_trial']) if e['exported_trial'] is not None else '-'} | {verdict} | {conf} |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", default=str(REPO / "studies" / "sim-h100-9b.yaml"))
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--n-trials", type=int, default=30)
    p.add_argument("--time-scale", type=float, help="the simulator's time scale (default: the spec's)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one seed's `run` may take")
    p.add_argument("--out", default=str(HERE / "results.json"))
    p.add_argument("--table", action="store_true", help="print the table of the seeds already in --out, run nothing")
    a = p.parse_args()
    path = Path(a.out)
    kept = json.loads(path.read_text()) if path.exists() else {"entries": []}
    entries = {e["seed"]: e for e in kept["entries"]}
    for seed in [] if a.table else seeds_of(a.seeds):
        e = one_seed(Path(a.spec), seed, a.n_trials, a.time_scale, a.timeout)
        entries[seed] = e
        print(f"seed {seed}: run rc {e['run_rc']} ({e['run_s']:.0f} s, {e['run_cpu_s']:.0f} s CPU), "
              f"export rc {e['export_rc']}, "
              f"trial {e['exported_trial']}: {' / '.join(e['header'][1:] or e['export_message'])}", flush=True)
        path.write_text(json.dumps({"spec": Path(a.spec).name, "n_trials": a.n_trials, "time_scale": a.time_scale,
                                    "host": f"{platform.machine()}, {os.cpu_count()} cores",
                                    "entries": [entries[s] for s in sorted(entries)]}, indent=2) + "\n")
    print(table([entries[s] for s in sorted(entries)]))
    ok = sum(1 for e in entries.values() if e["export_rc"] == 0)
    cpu = sum(e.get("run_cpu_s") or 0.0 for e in entries.values())
    print(f"\nexport exited 0 in {ok} of {len(entries)} seeds; `run` took {cpu / 60:.0f} min of CPU in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
