"""Soak: the daemon on the simulator under random faults, then a full accounting (issue 22).

SIMULATED: every trial launches the labelled twin (`autotune sim-serve`) for benchmarks/scale/scenario.yaml
on a virtual slot. One `autotune daemon` with SLOTS slots works a queue on a throwaway PostgreSQL server
(autotune/store/pgserver.py) for MINUTES; studies are submitted so that the queue never runs dry before
then. Every FAULT_EVERY seconds (jittered, from a seeded draw) one fault is chosen at random, each
kind once in every four faults:

- `server`: SIGKILL of one running `sim-serve` (the trial fails with its cause, the study goes on);
- `worker`: SIGKILL of one measurement worker (`autotune-worker`: the trial is `failed`, `worker_died`,
  and re-queued);
- `daemon`: SIGKILL of the daemon itself, a check that its workers and servers went with it, and a
  restart (its trials are recovered and re-queued by the new daemon);
- `postgres`: a PostgreSQL restart (fast shutdown, a few seconds down; writes wait it out).

After MINUTES no more studies are submitted; once the queue is finished the daemon is stopped with
SIGTERM. Then every study is accounted for: each Optuna trial has exactly one row in autotune_trials and
their states agree (COMPLETE: ok / infeasible / failed / stopped / duplicate; FAIL: interrupted, or
failed with worker_died); nothing is left RUNNING; every study of the queue is done with its trials;
no sim-serve or autotune-worker process is left. The log goes to --log; the summary (JSON) to --out.

    nice -n 10 python benchmarks/soak/soak.py --minutes 60 --slots 8 --fault-every 180 \\
        --out benchmarks/soak/soak-60min.json --log benchmarks/soak/soak-60min.log
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
import yaml  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from autotune.daemon.queue import StudyQueue  # noqa: E402
from autotune.engine.process import find_free_port  # noqa: E402
from autotune.node.worker import PROCESS_NAME  # noqa: E402
from autotune.store.pgserver import ThrowawayPostgres  # noqa: E402

SCENARIO = REPO / "benchmarks" / "scale" / "scenario.yaml"
FAULTS = ("server", "worker", "daemon", "postgres")
COMPLETE_STATES = {"ok", "infeasible", "failed", "stopped", "duplicate"}


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir: Path = args.workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_file = open(args.log, "w")
        self.daemon: subprocess.Popen[bytes] | None = None
        self.studies: list[str] = []
        self.faults: list[dict[str, Any]] = []
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOTUNE_HEARTBEAT_S": "2", "PYTHONUNBUFFERED": "1",
                    "AUTOTUNE_HOST": "soak"}

    def say(self, text: str) -> None:
        line = f"{dt.datetime.now(dt.timezone.utc):%H:%M:%S} {text}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    # -- processes ---------------------------------------------------------------------------------------
    def start_daemon(self) -> None:
        out = open(self.workdir / "daemon.log", "a")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "autotune", "daemon", "--gpus", f"0-{self.args.slots - 1}", "--storage", self.url,
             "--poll", "0.5", "--grace", "30", "--listen", f"127.0.0.1:{find_free_port()}",
             "--log-dir", str(self.workdir / "logs")],
            stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir, start_new_session=True)
        self.say(f"daemon started (pid {self.daemon.pid})")

    def descendants(self, match: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
        if self.daemon is None:
            return []
        try:
            kids = psutil.Process(self.daemon.pid).children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for p in kids:
            try:
                if match(p):
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def servers(self) -> list[psutil.Process]:
        return self.descendants(lambda p: "sim-serve" in " ".join(p.cmdline()))

    def workers(self) -> list[psutil.Process]:
        return self.descendants(lambda p: p.name() == PROCESS_NAME)

    def leftovers(self) -> list[str]:
        """sim-serve or autotune-worker processes started from the soak's folder, still running."""
        out = []
        for p in psutil.process_iter(["pid", "name", "cmdline"]):
            try:
                ours = Path(p.cwd()) == self.workdir.resolve()
                kind = ("server" if "sim-serve" in " ".join(p.info["cmdline"] or [])
                        else "worker" if p.info["name"] == PROCESS_NAME else None)
                if ours and kind and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{kind} {p.pid}")
            except psutil.Error:
                continue
        return out

    # -- faults --------------------------------------------------------------------------------------------
    def fault(self, kind: str) -> dict[str, Any]:
        at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        if kind in ("server", "worker"):
            procs = self.servers() if kind == "server" else self.workers()
            if not procs:
                return {"at": at, "fault": kind, "done": False, "why": f"no {kind} running"}
            victim = self.rng.choice(procs)
            os.kill(victim.pid, signal.SIGKILL)
            self.say(f"fault: SIGKILL {kind} {victim.pid}")
            return {"at": at, "fault": kind, "done": True, "pid": victim.pid}
        if kind == "daemon":
            assert self.daemon is not None
            family = self.servers() + self.workers()
            os.kill(self.daemon.pid, signal.SIGKILL)
            self.daemon.wait(timeout=30)
            gone, alive = psutil.wait_procs(family, timeout=30)
            self.say(f"fault: SIGKILL daemon {self.daemon.pid}; {len(gone)} of its server/worker processes went "
                     f"with it" + (f", LEFT: {[p.pid for p in alive]}" if alive else ""))
            for p in alive:          # not the daemon's job any more: clean up so the accounting can go on
                p.kill()
            self.start_daemon()
            return {"at": at, "fault": kind, "done": True, "children": len(family),
                    "left_behind": [p.pid for p in alive]}
        self.pg.restart(down_s=self.args.pg_down_s)
        self.say(f"fault: PostgreSQL restarted ({self.args.pg_down_s:g} s down)")
        return {"at": at, "fault": kind, "done": True}

    # -- the run -------------------------------------------------------------------------------------------
    def submit(self) -> None:
        name = f"soak{len(self.studies)}"
        spec = yaml.safe_load(SCENARIO.read_text())
        spec.update(name=name, storage="sqlite:///ignored.db")
        spec["engine"]["time_scale"] = self.args.time_scale
        spec["confirm"] = {"enabled": self.args.confirm}
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        subprocess.run([sys.executable, "-m", "autotune", "submit", str(path), "--n-trials",
                        str(self.args.trials_per_study), "--storage", self.url], check=True, capture_output=True,
                       env=self.env, cwd=self.workdir)
        self.studies.append(name)
        self.say(f"submitted {name} ({self.args.trials_per_study} trials)")

    def run(self) -> dict[str, Any]:
        """The soak; a SIGTERM or Ctrl-C of this script stops its daemon and its PostgreSQL server too."""
        def stop(signum: int, _frame: Any) -> None:
            raise SystemExit(f"soak stopped by {signal.Signals(signum).name}")
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            return self._run()
        finally:
            if self.daemon is not None and self.daemon.poll() is None:
                self.say(f"stopping the daemon (pid {self.daemon.pid})")
                os.killpg(self.daemon.pid, signal.SIGKILL)
                self.daemon.wait(timeout=60)

    def _run(self) -> dict[str, Any]:
        args = self.args
        with ThrowawayPostgres() as pg:
            self.pg = pg
            self.url = pg.create_database("soak")
            self.submit()
            self.submit()
            queue = StudyQueue(self.url, create=False)
            self.start_daemon()
            started = time.monotonic()
            end = started + args.minutes * 60
            next_fault = started + self.rng.uniform(0.5, 1.5) * args.fault_every
            deck: list[str] = []
            while True:
                now = time.monotonic()
                try:
                    states = {e.name: e.state for e in queue.entries()}
                except Exception as e:          # PostgreSQL is restarting
                    self.say(f"queue not readable now ({type(e).__name__})")
                    time.sleep(2)
                    continue
                open_ = [n for n, s in states.items() if s == "queued"]
                if now < end and len(open_) < 2:
                    self.submit()
                if now >= end and not open_:
                    break
                if now > end + args.drain_timeout_s:
                    self.say("the queue did not finish in time")
                    break
                if now >= next_fault and now < end:
                    if not deck:            # every kind once per four faults, in a seeded random order
                        deck = self.rng.sample(FAULTS, len(FAULTS))
                    self.faults.append(self.fault(deck.pop()))
                    next_fault = now + self.rng.uniform(0.5, 1.5) * args.fault_every
                assert self.daemon is not None
                if self.daemon.poll() is not None:
                    self.say(f"the daemon exited by itself (code {self.daemon.returncode}): restarting it")
                    self.faults.append({"fault": "none", "unexpected_exit": self.daemon.returncode})
                    self.start_daemon()
                time.sleep(1)
            assert self.daemon is not None
            self.daemon.send_signal(signal.SIGTERM)
            code = self.daemon.wait(timeout=300)
            self.say(f"daemon stopped by SIGTERM: exit {code}")
            time.sleep(2)
            summary = self.account(code, time.monotonic() - started)
        return summary

    def account(self, exit_code: int, wall_s: float) -> dict[str, Any]:
        eng = create_engine(self.url)
        problems: list[str] = []
        studies = {}
        with eng.connect() as conn:
            queue = {r.name: (r.state, r.n_trials) for r in conn.execute(text("select name, state, n_trials from autotune_queue"))}
            for name in self.studies:
                optuna_rows = conn.execute(text(
                    "select t.number, t.state from trials t join studies s on s.study_id = t.study_id "
                    "where s.study_name = :n"), {"n": name}).all()
                ours = conn.execute(text(
                    "select t.number, t.state, t.cause from autotune_trials t join autotune_studies s "
                    "on s.id = t.study_id where s.name = :n"), {"n": name}).all()
                by_number = Counter(r.number for r in ours)
                table = {r.number: (r.state, r.cause) for r in ours}
                for number, count in by_number.items():
                    if count != 1:
                        problems.append(f"{name}: trial {number} has {count} rows")
                for number, state in optuna_rows:
                    if state == "WAITING":
                        continue        # enqueued, never asked (a re-queue the study no longer needed)
                    if number not in table:
                        problems.append(f"{name}: Optuna trial {number} ({state}) has no row")
                        continue
                    ours_state, cause = table[number]
                    expect = ("FAIL" if ours_state == "interrupted" or (ours_state == "failed" and cause == "worker_died")
                              else "COMPLETE" if ours_state in COMPLETE_STATES else None)
                    if state != expect:
                        problems.append(f"{name}: trial {number}: Optuna {state}, table {ours_state}/{cause}")
                extra = set(table) - {n for n, _ in optuna_rows}
                if extra:
                    problems.append(f"{name}: rows without an Optuna trial: {sorted(extra)}")
                qstate, n_trials = queue.get(name, (None, 0))
                if qstate != "done":
                    problems.append(f"{name}: queue state {qstate}")
                states = Counter(s for s, _ in table.values())
                causes = Counter(c for s, c in table.values() if c)
                studies[name] = {"queue": qstate, "n_trials": n_trials, "optuna": dict(Counter(s for _, s in optuna_rows)),
                                 "table_states": dict(states), "causes": dict(causes)}
        eng.dispose()
        left = self.leftovers()
        if left:
            problems.append(f"processes left: {left}")
        if exit_code != 0:
            problems.append(f"the daemon's last exit code was {exit_code}")
        summary = {"simulated": True, "command": " ".join(sys.argv), "minutes": self.args.minutes,
                   "slots": self.args.slots, "wall_s": round(wall_s, 1), "faults": self.faults,
                   "fault_counts": dict(Counter(f["fault"] for f in self.faults if f.get("done"))),
                   "studies": studies, "problems": problems, "ok": not problems,
                   "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        self.say(("ACCOUNTED: " if not problems else "PROBLEMS: ") + json.dumps(
            {"faults": summary["fault_counts"], "studies": len(studies), "problems": problems}))
        return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0, help="how long faults are injected and studies submitted")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--fault-every", type=float, default=180.0, help="mean seconds between faults")
    p.add_argument("--trials-per-study", type=int, default=24)
    p.add_argument("--time-scale", type=float, default=10.0, help="the simulator's speed-up")
    p.add_argument("--confirm", action="store_true", help="let each study confirm its winners (longer)")
    p.add_argument("--pg-down-s", type=float, default=3.0)
    p.add_argument("--drain-timeout-s", type=float, default=1800.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/autotune-soak"))
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    summary = Soak(args).run()
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
