"""What the daemon's per-trial reads of the study table cost as a study grows: the whole-row read that
every tell, capacity hint and deadline check made before (`ResultStore.trials`), beside the narrow reads
that replace it (`trials_between`, `brackets`, `trial_times`), on SQLite and on PostgreSQL.

The rows are copies of the real rows of a short simulated study run first (`autotune run` on
scenario.yaml, 3 trials: SIMULATED numbers, real evidence columns), inserted N times over with their
numbers and times spread as a study's would be. Each read is timed as the median of several, in this
process, with nothing else running in it.

    python benchmarks/scale/store_reads.py --rows 100 400 800 1600 --out benchmarks/scale/store-reads-dev-2core.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import insert, select

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from autotune.store.models import TrialRecord  # noqa: E402
from autotune.store.repository import ResultStore  # noqa: E402
from autotune.tuner.sharing import overlapping  # noqa: E402

REPEATS = 7


def real_rows(workdir: Path) -> list[dict[str, Any]]:
    """The trial rows of a 3-trial simulated study (every column but the keys)."""
    spec = workdir / "s.yaml"
    spec.write_text((HERE / "scenario.yaml").read_text().replace("name: scale", "name: reads"))
    url = f"sqlite:///{workdir / 'seed.db'}"
    subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(spec), "--storage", url,
                    "--n-trials", "3", "--no-progress"], check=True, cwd=workdir, stdout=subprocess.DEVNULL)
    store = ResultStore(url)
    with store.session() as s:
        recs = list(s.scalars(select(TrialRecord).where(TrialRecord.state == "ok")))
    cols = [c.name for c in TrialRecord.__table__.columns if c.name not in ("id", "study_id", "number")]
    return [{c: getattr(r, c) for c in cols} for r in recs]


def fill(url: str, rows: list[dict[str, Any]], n: int) -> tuple[ResultStore, int]:
    """A study of n trials: the real rows in turn, 8 s apart on 8 slots, the last 8 still running."""
    store = ResultStore(url)
    study = store.ensure_study(name=f"reads-{n}", model="m", engine_kind="sim", engine_command=[], fixed_flags=[],
                               space_hash="h", spec_hash="x", spec={}, objectives=[["capacity_tps", "maximize"]],
                               slo="ttft:p99<=1s", quality_knobs=[])
    t0 = dt.datetime(2026, 12, 3, 9, 0, 0)
    batch = []
    for i in range(n):
        row = dict(rows[i % len(rows)])
        start = t0 + dt.timedelta(seconds=i)
        row.update(study_id=study.id, number=i, started_at=start,
                   finished_at=None if i >= n - 8 else start + dt.timedelta(seconds=8))
        batch.append(row)
    with store.engine.begin() as conn:
        conn.execute(insert(TrialRecord.__table__), batch)
    return store, study.id


def timed(fn: Callable[[], Any]) -> float:
    """Median milliseconds of REPEATS calls."""
    out = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(out), 2)


def measure(url: str, rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    store, sid = fill(url, rows, n)
    t0 = dt.datetime(2026, 12, 3, 9, 0, 0)
    start, end = t0 + dt.timedelta(seconds=n - 8), t0 + dt.timedelta(seconds=n + 1)   # the last trial's run
    full_overlap = timed(lambda: overlapping(store.trials(sid), n - 1, start, end))
    narrow_overlap = timed(lambda: overlapping(store.trials_between(sid, start, end), n - 1, start, end))
    assert overlapping(store.trials(sid), n - 1, start, end) == overlapping(store.trials_between(sid, start, end),
                                                                             n - 1, start, end)
    result = {"rows": n,
              "full_read_ms": timed(lambda: store.trials(sid)),
              "overlap_full_ms": full_overlap, "overlap_narrow_ms": narrow_overlap,
              "brackets_full_ms": timed(lambda: [(r.capacity or {}).get("bracket") for r in store.trials(sid)
                                                 if r.state == "ok"]),
              "brackets_narrow_ms": timed(lambda: store.brackets(sid)),
              "times_narrow_ms": timed(lambda: store.trial_times(sid))}
    store.engine.dispose()
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[100, 400, 800, 1600])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--no-postgres", action="store_true", help="SQLite only")
    args = p.parse_args()
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="autotune-reads-") as tmp:
        work = Path(tmp)
        rows = real_rows(work)
        print(f"{len(rows)} real rows, {sum(len(json.dumps(r, default=str)) for r in rows) // len(rows)} "
              "bytes each as JSON", flush=True)
        backends: list[tuple[str, Callable[[int], str]]] = [
            ("sqlite", lambda n: f"sqlite:///{work / f'r{n}.db'}")]
        pg = None
        if not args.no_postgres:
            from autotune.store.pgserver import ThrowawayPostgres, find_bindir
            if find_bindir() is not None:
                pg = ThrowawayPostgres().start()
                backends.append(("postgresql", lambda n: pg.create_database(f"reads_{n}")))
        try:
            for name, url_for in backends:
                results[name] = []
                for n in args.rows:
                    r = measure(url_for(n), rows, n)
                    print(name, json.dumps(r), flush=True)
                    results[name].append(r)
        finally:
            if pg is not None:
                pg.stop()
    args.out.write_text(json.dumps({
        "command": "benchmarks/scale/store_reads.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "simulated_rows": True, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
