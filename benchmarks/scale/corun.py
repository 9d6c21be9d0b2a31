"""How much do co-running trials disturb each other? One config measured REPEATS times alone (one trial
at a time on one GPU) and REPEATS times two at once (two one-GPU trials, each on its own GPU, cores and
ports, started together), through the same trial runner and leases as the scheduler.

    # on a host with two GPUs (the real measurement the issue asks for; the study's model must be there):
    python benchmarks/scale/corun.py --study studies/h200-llama8b.yaml --gpus 0,1 --repeats 3 \
        --out benchmarks/scale/corun-h200.json
    # SIMULATED, anywhere (virtual slots): the same script on the scale scenario
    python benchmarks/scale/corun.py --study benchmarks/scale/scenario.yaml --gpus 0,1 --repeats 3 \
        --out benchmarks/scale/corun-sim-dev-2core.json

The config is the study's baseline (vLLM's defaults plus its `baseline:` flags) unless --flags gives one.
Evidence goes to a throwaway SQLite file; the JSON holds every measurement and the co-run/alone ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from autotune.node.pool import GpuPool, parse_gpus  # noqa: E402
from autotune.flags import mapping_to_flags  # noqa: E402
from autotune.spec import load_spec_file  # noqa: E402
from autotune.store.repository import ResultStore  # noqa: E402
from autotune.tuner.command import prepare_spec  # noqa: E402
from autotune.tuner.host import cpu_model, nvml_gpus  # noqa: E402
from autotune.tuner.trial import TrialRunner  # noqa: E402

KEYS = ("capacity_tps", "output_tps", "p99_ttft_ms", "p50_tpot_ms")


def measure(runner: TrialRunner, pool: GpuPool, number: int, flags: list[str]) -> dict[str, Any]:
    lease = pool.try_lease(1)
    assert lease is not None
    try:
        out = runner.run(number, flags, [], lambda _t: None, lease=lease)
    finally:
        pool.release(lease)
    row: dict[str, Any] = {"trial": number, "slot": lease.slots[0], "gpus": list(lease.gpus),
                           "cores": list(lease.cores), "state": out.state, "cause": out.cause}
    row.update({k: out.observed.get(k) for k in KEYS})
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows), "failed": sum(r["state"] == "failed" for r in rows)}
    for k in KEYS:
        vals = [r[k] for r in rows if r.get(k) is not None]
        if vals:
            out[k] = {"mean": round(statistics.fmean(vals), 2), "min": round(min(vals), 2), "max": round(max(vals), 2)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", required=True)
    p.add_argument("--gpus", default="0,1", help="two GPU indices (virtual slots where NVML sees none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--flags", default="", help="the config's flags (default: the study's baseline)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    gpus = parse_gpus(args.gpus)
    if len(gpus) != 2:
        sys.exit("corun: give exactly two GPUs")
    tmp = Path(tempfile.mkdtemp(prefix="autotune-corun-"))
    raw = load_spec_file(args.study)
    raw.update(storage=f"sqlite:///{tmp / 'corun.db'}", gpus=[gpus[0]])
    parts = prepare_spec(raw, args.study, Path(args.study).resolve().parent)
    spec = parts["spec"]
    flags = shlex.split(args.flags) if args.flags else mapping_to_flags(spec.baseline or {})
    store = ResultStore(spec.storage_url)
    runner = TrialRunner(spec, parts["engine"], parts["telemetry"], store, tmp / "logs", parts["fixed_flags"],
                         parts["predict"])
    physical = bool(nvml_gpus()) and spec.engine.kind == "vllm"
    pool = GpuPool(gpus, physical=physical)
    alone = [measure(runner, pool, i, flags) for i in range(args.repeats)]
    corun: list[dict[str, Any]] = []
    for r in range(args.repeats):
        pair: list[dict[str, Any]] = []
        threads = [threading.Thread(target=lambda n=n: pair.append(measure(runner, pool, n, flags)))
                   for n in (100 + 2 * r, 101 + 2 * r)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        corun.extend(pair)
    a, c = summary(alone), summary(corun)
    ratio = {k: round(c[k]["mean"] / a[k]["mean"], 3) for k in KEYS if k in a and k in c and a[k]["mean"]}
    body = {"simulated": spec.engine.kind == "sim", "study": args.study, "flags": flags,
            "command": " ".join(sys.argv), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": nvml_gpus(),
                        "platform": platform.platform(), "loadavg": os.getloadavg()},
            "alone": alone, "corun": corun, "summary": {"alone": a, "corun": c, "corun_over_alone": ratio}}
    out_tmp = args.out.with_suffix(".tmp")
    out_tmp.write_text(json.dumps(body, indent=2, default=str) + "\n")
    out_tmp.replace(args.out)
    print(json.dumps(body["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
