"""Tables of benchmarks/gpu/round2/RESULTS.md (two H200s), generated from the committed files.

The study tables (trials, telemetry, failures, steps, the simulator beside each trial) are
benchmarks/gpu/report.py's, run on the round-2 DBs; this adds what round 2 has that round 1 had not:
NVML per GPU (from the nvidia-smi CSVs logged during each device call, cut to each trial's load
window), every layout side by side (measured and simulated), and the co-run measurement.

    .venv/bin/python benchmarks/gpu/round2/report2.py                 # print every block
    .venv/bin/python benchmarks/gpu/round2/report2.py --update benchmarks/gpu/round2/RESULTS.md
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import report as r1  # noqa: E402  (benchmarks/gpu/report.py)
from autotune.slo import SLO  # noqa: E402

DEVICE = HERE / "device"
STUDIES = {   # DB, model shape, the nvidia-smi CSVs of the calls that ran it
    "dense": (HERE / "h200x2-dense.db", HERE.parent / "llama8b-shaped-config.json", ["nvml-c7.csv.gz"]),
    "mixtral": (HERE / "h200x2-mixtral.db", HERE / "mixtral-shaped-config.json",
                ["nvml-m1.csv.gz", "nvml-m2.csv.gz", "nvml-m3.csv.gz"]),
}
BUSY_PCT = 5.0   # a GPU sample at or above this utilisation counts as working


def nvml_rows(files: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in files:
        with gzip.open(DEVICE / name, "rt") as f:
            for rec in csv.reader(f):
                if len(rec) < 9:
                    continue
                ts, idx, power, util, mutil, mem, sm, temp, _ = (x.strip() for x in rec[:9])
                rows.append({"t": datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp(), "gpu": int(idx),
                             "power_w": float(power.split()[0]), "util": float(util.split()[0]),
                             "mem_util": float(mutil.split()[0]), "mem_mib": float(mem.split()[0]),
                             "sm_mhz": float(sm.split()[0])})
    return rows


def load_window(t: r1.Trial, rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """The trial's load: the `duration_s` of its telemetry summary, ending at the last sample inside
    the trial where a GPU still worked (after it the server is stopped). The CSV clock and the DB
    clock are the same host's UTC."""
    start, end = r1._ts(t["started_at"]), r1._ts(t["finished_at"])
    busy = [x["t"] for x in rows if start <= x["t"] <= end and x["util"] >= BUSY_PCT]
    if not busy or not t["telemetry"]:
        return None
    last = max(busy)
    return last - float(t["telemetry"]["duration_s"]), last


def sec_pergpu(db: Path, files: list[str]) -> str:
    study, trials = r1.load(db)
    rows = nvml_rows(files)
    out = []
    for t in r1.measured(trials):
        win = load_window(t, rows)
        if win is None:
            continue
        for g in (0, 1):
            xs = [x for x in rows if x["gpu"] == g and win[0] <= x["t"] <= win[1]]
            if not xs:
                continue
            n = len(xs)
            out.append([t["number"], r1.short_params(t), g, n, r1.fmt(sum(x["power_w"] for x in xs) / n, 0),
                        r1.fmt(max(x["power_w"] for x in xs), 0), r1.fmt(sum(x["util"] for x in xs) / n, 0),
                        r1.fmt(sum(x["mem_util"] for x in xs) / n, 0),
                        r1.fmt(max(x["mem_mib"] for x in xs) / 1024, 1), r1.fmt(sum(x["sm_mhz"] for x in xs) / n, 0)])
    return r1.table(["#", "layout", "GPU", "samples (1 Hz)", "mean W", "max W", "util %", "mem-bus util %",
                     "peak mem GiB", "mean SM MHz"], out)


def sec_layouts() -> str:
    """Every layout of both studies on one table: measured capacity beside the simulator's."""
    out = []
    for key, (db, cfg, _) in STUDIES.items():
        study, trials = r1.load(db)
        slo = SLO.parse(study["slo"])
        n = study["spec"]["load"]["requests_per_step"]
        wl = trials[0]["workload"]
        for t in r1.measured(trials):
            cap = int(t["capacity"]["capacity"])
            probe = t["capacity"]["steps"][0]
            s1 = r1._sim(str(cfg), t["flags"], 1, probe["completed"], wl["input_len"], wl["output_len"])
            pcap = r1.sim_capacity(str(cfg), t["flags"], slo, n, wl["input_len"], wl["output_len"])
            sc = r1._sim(str(cfg), t["flags"], pcap, n, wl["input_len"], wl["output_len"])
            out.append([key, t["number"], r1.short_params(t), r1.bracket(t["capacity"]), pcap,
                        r1.fmt(t["objectives"]["capacity_tps"], 0), r1.fmt(sc["output_throughput"], 0),
                        r1.pct(sc["output_throughput"], t["objectives"]["capacity_tps"]),
                        r1.fmt(probe["output_throughput"], 1), r1.fmt(s1["output_throughput"], 1),
                        r1.pct(s1["output_throughput"], probe["output_throughput"]),
                        r1.fmt(t["kv_cache_tokens"]), r1.fmt(t["startup_seconds"], 0)])
    return r1.table(["model", "#", "layout", "capacity met / broken (streams)", "SIM capacity (streams)",
                     "capacity_tps real", "SIM tok/s at its capacity", "SIM error", "1-stream tok/s real",
                     "SIM 1-stream", "SIM error", "KV tokens", "startup s"], out)


def sec_corun() -> str:
    rows = []
    for name in ("alone-gpu0-a", "alone-gpu1-a", "together-gpu0", "together-gpu1"):
        with gzip.open(DEVICE / "corun" / f"{name}.json.gz", "rt") as f:
            d = json.load(f)
        rows.append([name, d["completed"], r1.fmt(d["duration"], 2), r1.fmt(d["output_throughput"], 0),
                     r1.fmt(d["steady_output_throughput"], 0), r1.fmt(d["median_ttft_ms"], 0),
                     r1.fmt(d["p99_ttft_ms"], 0), r1.fmt(d["median_tpot_ms"], 2), r1.fmt(d["p99_tpot_ms"], 2),
                     r1.fmt(d["median_e2el_ms"], 0), f"{d['slo_attainment_pct']:.1f} %",
                     r1.fmt(d["prefix_cache_hit_pct"], 1)])
    return r1.table(["run", "requests", "duration s", "out tok/s", "steady out tok/s", "p50 TTFT ms", "p99 TTFT ms",
                     "p50 TPOT ms", "p99 TPOT ms", "p50 E2E ms", "SLO attainment", "prefix hits %"], rows)


def build() -> dict[str, str]:
    blocks: dict[str, str] = {"layouts": sec_layouts(), "corun": sec_corun()}
    for key, (db, cfg, files) in STUDIES.items():
        study, trials = r1.load(db)
        blocks[f"{key}-facts"] = r1.sec_facts(study, trials)
        blocks[f"{key}-trials"] = r1.sec_trials(study, trials)
        blocks[f"{key}-telemetry"] = r1.sec_telemetry(study, trials)
        blocks[f"{key}-failures"] = r1.sec_failures(study, trials)
        blocks[f"{key}-steps"] = "\n\n".join(f"#{t['number']} ({r1.short_params(t)}):\n\n{r1._steps(t)}"
                                             for t in r1.measured(trials))
        blocks[f"{key}-sim"] = r1.sec_sim(study, trials, str(cfg))
        blocks[f"{key}-pergpu"] = sec_pergpu(db, files)
    return blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", type=Path, help="rewrite the report blocks of this markdown file")
    a = ap.parse_args()
    blocks = build()
    if a.update:
        r1.update(a.update, blocks)
    else:
        for name, body in blocks.items():
            print(f"<!-- report:{name} -->\n{body}\n<!-- /report:{name} -->\n")


if __name__ == "__main__":
    main()
