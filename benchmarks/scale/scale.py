"""Trial throughput of the daemon as the pool grows, and of two daemons sharing one PostgreSQL study.

SIMULATED: every trial launches the labelled twin (`autotune sim-serve`) for benchmarks/scale/scenario.yaml
on a virtual GPU slot. What is measured is the scheduler's throughput (finished trials per hour), not the
candidates' numbers. Both the twin and the load client are CPU-bound Python processes, so the scaling
seen is bounded by the host's free cores: measure where there are cores for it (16-32 on the GPU hosts).

    python benchmarks/scale/scale.py --slots 1 2 4 8 --two-daemons 4 --out benchmarks/scale/results-HOST.json

Each configuration gets a fresh database on one throwaway PostgreSQL server (autotune/store/pgserver.py),
`autotune submit` of the scenario with TRIALS_PER_SLOT x slots trials, and one or two `autotune daemon`
processes (two "hosts" by AUTOTUNE_HOST, disjoint slots); it ends when the study leaves the queue, then
the daemons are stopped with SIGTERM. Throughput = finished trials / (last finish - first start).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from autotune.daemon.queue import StudyQueue  # noqa: E402
from autotune.engine.process import find_free_port  # noqa: E402
from autotune.store.pgserver import ThrowawayPostgres  # noqa: E402
from autotune.tuner.host import cpu_model  # noqa: E402

SCENARIO = Path(__file__).with_name("scenario.yaml")
FINISHED = ("ok", "infeasible", "failed")


def run_config(pg: ThrowawayPostgres, label: str, pools: list[list[int]], n_trials: int, workdir: Path,
               timeout_s: float, scenario: Path = SCENARIO) -> dict[str, Any]:
    url = pg.create_database(label.replace("-", "_"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOTUNE_HEARTBEAT_S": "2", "PYTHONUNBUFFERED": "1"}
    subprocess.run([sys.executable, "-m", "autotune", "submit", str(scenario), "--n-trials", str(n_trials),
                    "--storage", url], check=True, capture_output=True, env=env, cwd=REPO)
    procs = []
    for i, pool in enumerate(pools):
        log = open(workdir / f"{label}-daemon{i}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "autotune", "daemon", "--gpus", ",".join(map(str, pool)), "--storage", url,
             "--poll", "0.5", "--listen", f"127.0.0.1:{find_free_port()}", "--log-dir", str(workdir / "logs")],
            stdout=log, stderr=subprocess.STDOUT, env={**env, "AUTOTUNE_HOST": f"bench-{i}"}, cwd=REPO,
            start_new_session=True))
    queue = StudyQueue(url, create=False)
    load_before = os.getloadavg()
    end = time.monotonic() + timeout_s
    try:
        while queue.entry("scale").state != "done":
            if time.monotonic() > end or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{label}: the study did not finish (see {workdir}/{label}-daemon*.log)")
            time.sleep(1)
    finally:
        # the daemon process's own CPU (scheduler, trial threads, store, heartbeats; not its workers or servers)
        daemon_cpu = [_cpu_s(p.pid) for p in procs]
        daemon_wall = time.monotonic() - (end - timeout_s)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=120) for p in procs]
    eng = create_engine(url)
    with eng.connect() as conn:
        rows = conn.execute(text("select number, state, cause, host, started_at, finished_at, client, "
                                 "measurement_flags, capacity, startup_seconds, lease from autotune_trials")).all()
    eng.dispose()
    # finished trials (a failed one whose measurement worker died was re-queued and is not one of them)
    done = [r for r in rows if r.state in FINISHED and r.finished_at is not None and r.cause != "worker_died"]
    # a candidate rejected before any launch (memory model, known constraint) holds no slot for a moment and
    # does not count toward --n-trials: counted apart, never in the throughput
    unlaunched = [r for r in done if r.cause in ("predicted_oom", "constraint")]
    done = [r for r in done if r not in unlaunched]
    early = sum(r.state == "stopped" for r in rows)
    # whatever is neither (a worker that died, a duplicate, a trial left running): named when not accounted
    rest = Counter(f"{r.state}/{r.cause}" for r in rows
                   if r not in done and r not in unlaunched and r.state != "stopped")
    shares = {r.number: _json(r.client).get("cpu_share") for r in done if r.client}
    saturated = sorted(r.number for r in done if r.cause == "client_saturated"
                       or "client_saturated" in (_json(r.measurement_flags) or []))
    # what each flagged step's client said of itself: its loop's lag, the CPU it waited for, its collections
    notes = {r.number: [st.get("client_note") for st in (_json(r.capacity).get("steps") or [])
                        if st.get("client_saturated")] for r in done if r.number in saturated}
    first, last = min(r.started_at for r in done), max(r.finished_at for r in done)
    window = (last - first).total_seconds()
    walls = [(r.finished_at - r.started_at).total_seconds() for r in done]
    phases = [_phases(r) for r in done if r.startup_seconds is not None and _json(r.client).get("wall_s") is not None]
    return {"label": label, "daemons": len(pools), "slots": sum(len(p) for p in pools), "n_trials": n_trials,
            "finished": len(done), "rejected_unlaunched": len(unlaunched), "early_stopped": early, "accounted": len(done) + early == n_trials,
            "interrupted": sum(r.state == "interrupted" for r in rows), "other_rows": dict(rest),
            "by_host": {h: sum(r.host == h for r in done) for h in sorted({r.host for r in done})},
            "window_s": round(window, 1), "trials_per_hour": round(len(done) / window * 3600, 1),
            # how full the slots were over the window (lease-to-finish seconds / slot seconds): what a ramp,
            # a drain or a wait between trials costs the rate, apart from how long each trial took
            "slot_busy_share": round(sum(walls) / (window * sum(len(p) for p in pools)), 3),
            # the idle slot-seconds split by where they fall: before a slot's first trial, between two
            # trials on one slot (the tell, the next ask, the poll), after a slot's last trial (the drain)
            **_idle(done, first, window),
            "mean_trial_wall_s": round(statistics.fmean(walls), 2),
            # where a trial's wall goes: its server's start, its load (the worker's measured span), and the
            # rest (spawning the worker, stopping the server, the tell and the writes)
            "phases_mean_s": {k: round(statistics.fmean(p[k] for p in phases), 2) for k in ("startup", "load", "rest")}
            if phases else None,
            "trials": [{"number": r.number, "host": r.host, "start_s": round((r.started_at - first).total_seconds(), 2),
                        "wall_s": round((r.finished_at - r.started_at).total_seconds(), 2),
                        "slots": (_json(r.lease).get("slots") if r.lease else None),
                        **({k: round(v, 2) for k, v in _phases(r).items()} if r.startup_seconds is not None
                           and _json(r.client).get("wall_s") is not None else {})}
                       for r in sorted(done, key=lambda r: r.started_at)],
            # from the lease to the tell (a trial's start is rewritten when it gets its slot)
            "median_ask_to_finish_s": round(statistics.median(walls), 2),
            # each measured trial's load client (its worker process): CPU seconds / wall seconds, of one core
            "client_cpu_share": {"median": _median(shares.values()),
                                 "max": max((x for x in shares.values() if x is not None), default=None),
                                 "per_trial": dict(sorted(shares.items()))},
            "client_saturated": len(saturated), "client_saturated_trials": saturated,
            "client_saturated_notes": notes,
            "daemon_cpu_share": [round(c / daemon_wall, 3) if c is not None else None for c in daemon_cpu],
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()], "exit_codes": codes}


def _idle(done: list[Any], first: Any, window: float) -> dict[str, Any]:
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in done:
        start = (r.started_at - first).total_seconds()
        for slot in (_json(r.lease).get("slots") or []) if r.lease else []:
            spans.setdefault(slot, []).append((start, start + (r.finished_at - r.started_at).total_seconds()))
    if not spans:
        return {}
    for v in spans.values():
        v.sort()
    gaps = [b[0] - a[1] for v in spans.values() for a, b in zip(v, v[1:])]
    return {"idle_slot_s": {"ramp": round(sum(v[0][0] for v in spans.values()), 1),
                            "between": round(sum(gaps), 1),
                            "drain": round(sum(window - max(e for _, e in v) for v in spans.values()), 1)},
            "gap_between_trials_s": {"mean": round(statistics.fmean(gaps), 2) if gaps else None,
                                     "max": round(max(gaps), 2) if gaps else None}}


def _json(value: Any) -> Any:
    """A JSON column as PostgreSQL's driver hands it back (already decoded) or as text."""
    return json.loads(value) if isinstance(value, str) else (value or {})


def _cpu_s(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


def _phases(r: Any) -> dict[str, float]:
    wall = (r.finished_at - r.started_at).total_seconds()
    load = float(_json(r.client)["wall_s"])
    return {"startup": r.startup_seconds, "load": load, "rest": wall - r.startup_seconds - load}


def _median(values: Any) -> float | None:
    xs = [x for x in values if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8], help="virtual GPU slots, one daemon")
    p.add_argument("--two-daemons", type=int, default=0, metavar="K",
                   help="also: one daemon with K slots against two daemons with K slots each, one study")
    p.add_argument("--trials-per-slot", type=int, default=4)
    p.add_argument("--one-slot-trials", type=int, default=None,
                   help="trials of the one-slot configuration (default: --trials-per-slot); its rate is what every "
                        "other is divided by, so it wants more trials than a slot of a larger pool")
    p.add_argument("--sampler", choices=["tpe", "random"], default=None,
                   help="override the scenario's sampler; `random` draws every configuration's candidates from one "
                        "distribution, where TPE's mix depends on the study's size (20 trials against 160)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/autotune-scale"))
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    configs: list[tuple[str, list[list[int]]]] = [(f"one-daemon-{n}-slots", [list(range(n))]) for n in args.slots]
    if args.two_daemons:
        k = args.two_daemons
        if k not in args.slots:
            configs.append((f"one-daemon-{k}-slots", [list(range(k))]))
        configs.append((f"two-daemons-{k}-slots-each", [list(range(k)), list(range(k, 2 * k))]))
    scenario = SCENARIO
    if args.sampler is not None:
        scenario = args.workdir / "scenario.yaml"
        scenario.write_text(SCENARIO.read_text() + f"sampler: {args.sampler}\n")
    results = []
    with ThrowawayPostgres() as pg:
        for label, pools in configs:
            slots = sum(len(x) for x in pools)
            n = args.one_slot_trials if slots == 1 and args.one_slot_trials else args.trials_per_slot * slots
            r = run_config(pg, label, pools, n, args.workdir, args.timeout, scenario)
            print(json.dumps(r), flush=True)
            results.append(r)
    base = next((r for r in results if r["slots"] == 1 and r["daemons"] == 1), None)
    for r in results:
        if base is not None:
            r["speedup_vs_one_slot"] = round(r["trials_per_hour"] / base["trials_per_hour"], 2)
    if args.two_daemons:
        one = next(r for r in results if r["label"] == f"one-daemon-{args.two_daemons}-slots")
        two = next(r for r in results if r["daemons"] == 2)
        two["speedup_vs_one_daemon"] = round(two["trials_per_hour"] / one["trials_per_hour"], 2)
    body = {"simulated": True, "scenario": scenario.read_text(), "command": " ".join(sys.argv),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
                        "platform": platform.platform()},
            "trials_per_slot": args.trials_per_slot, "results": results}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
