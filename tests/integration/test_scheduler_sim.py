"""The scheduler on the labelled simulator (real processes, real HTTP, real SQLite): parallel trials on
virtual GPUs, two `autotune run` processes sharing one study, and one of them killed mid-trial."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil


def _spec(sim_spec, name: str = "sched", requests_per_step: int = 40, confirm: bool = False) -> Path:
    """Confirmation off unless asked for: it repeats three configurations three times (more runs than the
    trials these tests follow); the two-process test keeps it, since both processes reach it."""
    return sim_spec(name, load={"requests_per_step": requests_per_step}, confirm={"enabled": confirm})


def _q(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_parallel_two_on_four_virtual_gpus_overlaps_and_records_leases(autotune_run, servers_in, sim_spec,
                                                                         tmp_path: Path) -> None:
    spec = _spec(sim_spec)
    db = tmp_path / "sched.db"
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "4", "--gpus", "0-3", "--parallel", "2",
                        "--no-progress"], tmp_path)
    assert run.finish(300) == 0, "\n".join(run.lines)
    assert not any("Traceback" in line for line in run.lines)
    rows = _q(db, "select number, state, started_at, finished_at, lease, overlapped, measurement_flags, host "
                  "from autotune_trials order by number")
    assert len(rows) == 4 and all(r[1] in ("ok", "infeasible", "failed") for r in rows)
    launched = [r for r in rows if r[4] is not None]        # a candidate a free check rejected never leases
    assert len(launched) >= 2
    leases = {r[0]: json.loads(r[4]) for r in launched}
    overlapped = {r[0]: json.loads(r[5]) for r in launched}
    for number, lease in leases.items():
        assert lease["gpus"] == [] and len(lease["slots"]) == 1 and set(lease["slots"]) <= {0, 1, 2, 3}
        assert lease["cores"] and lease["port"] >= 1024
    # Trials that ran at the same time held disjoint slots, know about each other and carry the flag.
    pairs = [(a, b) for a in overlapped for b in overlapped[a]]
    assert pairs, "with --parallel 2 some trials must have run at the same time"
    for a, b in pairs:
        assert a in overlapped[b]
        assert not set(leases[a]["slots"]) & set(leases[b]["slots"])
        assert "overlapped" in json.loads(rows[a][6]) and b in leases
    assert all(r[7] for r in rows)                          # the host is recorded
    show = subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", f"sqlite:///{db}"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert show.returncode == 0 and "overlapped trial(s)" in show.stdout and "slots" in show.stdout

    # SIGTERM with two trials in a load step (long steps: 400 requests): both are interrupted at once
    # and re-queued, and no server survives.
    stop_spec = _spec(sim_spec, "stop", requests_per_step=400)
    stop_db = tmp_path / "stop.db"
    run = autotune_run(["run", "--study", str(stop_spec), "--n-trials", "8", "--gpus", "0-3", "--parallel", "2",
                        "--no-progress"], tmp_path)
    run.wait_for(lambda ls: len(_measuring(ls)) >= 2, 180)
    servers = [pid for (pid,) in _q(stop_db, "select pid from autotune_processes")]
    signalled = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(60) == 143
    assert time.monotonic() - signalled < 20
    assert "stopped by SIGTERM" in run.lines[-1] and not any("Traceback" in l for l in run.lines), \
        "\n".join(run.lines)
    interrupted = _q(stop_db, "select number, params from autotune_trials where state = 'interrupted'")
    assert len(interrupted) == 2, _q(stop_db, "select number, state, cause from autotune_trials")
    waiting = _q(stop_db, "select count(*) from trials where state = 'WAITING'")[0][0]
    assert waiting == len(interrupted)                     # each re-queued once
    assert len(servers) == 2 and not [p for p in servers if _alive(p)]
    assert not servers_in(tmp_path, "sim-serve")


def _measuring(lines: list[str]) -> set[str]:
    """Trials (by their tag) in a capacity search now: started one and not yet finished. A trial whose
    server is being stopped has finished its search (its result line comes after the stop, which on a
    loaded machine takes long enough for a signal to land there and find the measurement whole)."""
    started = {l.split("]")[0].strip() for l in lines if "] capacity search by" in l}
    ended = {l.split("]")[0].strip() for l in lines if l.startswith("[trial") and ": " in l
             and l.split("]")[1].strip().split(":")[0] in ("ok", "failed", "infeasible", "interrupted")}
    stopping = {l.split("]")[0].strip() for l in lines if "] stopping server" in l}
    return started - ended - stopping


def _in_capacity_search(lines: list[str]) -> bool:
    """A one-at-a-time run (untagged phase lines) is measuring a trial now."""
    heads = [i for i, l in enumerate(lines) if l.startswith("[trial")]
    if not heads or not any(f"] {role}:" in lines[heads[-1]] for role in ("baseline", "search", "enqueued")):
        return False
    return any("capacity search" in l for l in lines[heads[-1] + 1:])


def _two_runs(autotune_run, monkeypatch, tmp_path: Path, spec: Path, hosts: tuple[str, str] | None):
    args = ["run", "--study", str(spec), "--n-trials", "8", "--no-progress"]
    runs = []
    for i in range(2):
        if hosts:
            monkeypatch.setenv("AUTOTUNE_HOST", hosts[i])
        runs.append(autotune_run(args, tmp_path))
        if i == 0:       # the second joins once the first has opened the study and asked for a trial
            runs[0].wait_for(lambda ls: any(line.startswith("[trial") for line in ls), 180)
    return runs


def _check_study(db: Path, lines: list[str]) -> list[tuple]:
    assert not any("Traceback" in line or "Error:" in line for line in lines), "\n".join(lines)
    states = [s for (s,) in _q(db, "select state from trials")]
    complete = states.count("COMPLETE")
    assert 8 <= complete <= 9, states        # one trial of overshoot at most (docs/SCHEDULER.md, "Budget")
    rows = _q(db, "select number, state, params, role from autotune_trials order by number")
    assert [r[3] for r in rows if r[1] != "interrupted"].count("baseline") == 1   # enqueued once across processes
    ran = [r[2] for r in rows if r[1] != "interrupted"]
    assert len(ran) == len(set(ran)), "a candidate ran twice"
    return rows


def test_two_processes_share_one_sqlite_study(autotune_run, servers_in, monkeypatch, sim_spec,
                                              tmp_path: Path) -> None:
    spec = _spec(sim_spec, "shared", confirm=True)
    db = tmp_path / "shared.db"
    a, b = _two_runs(autotune_run, monkeypatch, tmp_path, spec, None)
    assert a.finish(400) == 0, "\n".join(a.lines)
    assert b.finish(400) == 0, "\n".join(b.lines)
    _check_study(db, a.lines + b.lines)
    assert _q(db, "select count(*) from trials where state = 'FAIL'")[0][0] == 0   # none failed while its owner lived
    owners = {pid for (pid,) in _q(db, "select distinct pid from autotune_enqueued")}
    assert owners                                           # the enqueues were claimed
    both = [l for l in a.lines if l.startswith("[trial")], [l for l in b.lines if l.startswith("[trial")]
    assert both[0] and both[1], "both processes ran trials"
    # both processes reach the confirmation: its three rounds are recorded once each (one row per trial and
    # round is the table's own constraint), the baseline in every round
    rounds = _q(db, "select c.round, t.role from autotune_confirmations c join autotune_trials t on t.id = c.trial_id")
    assert {r for r, _ in rounds} == {0, 1, 2} and all((r, "baseline") in rounds for r in range(3)), rounds
    assert not servers_in(tmp_path, "sim-serve")


def test_sigkill_of_one_process_the_other_reruns_its_trial_once(autotune_run, servers_in, monkeypatch, sim_spec,
                                                               tmp_path: Path) -> None:
    # Two "hosts" (AUTOTUNE_HOST), so only the heartbeat (1 s, stale after 3 s) can tell that a is dead.
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")
    spec = _spec(sim_spec, "killed")
    db = tmp_path / "killed.db"
    a, b = _two_runs(autotune_run, monkeypatch, tmp_path, spec, ("host-a", "host-b"))
    a.wait_for(_in_capacity_search, 240)
    victims = [pid for (pid,) in _q(db, "select pid from autotune_processes where owner_pid = ?", a.proc.pid)]
    killed_trial = _q(db, "select number, params from autotune_trials where state = 'running' and host = 'host-a'")
    a.proc.send_signal(signal.SIGKILL)
    a.finish(30)
    assert victims and len(killed_trial) == 1
    deadline = time.monotonic() + 20
    while [p for p in victims if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in victims if _alive(p)], "the killed run's server outlived it"
    assert b.finish(400) == 0, "\n".join(b.lines)
    rows = _check_study(db, b.lines)
    number, params = killed_trial[0]
    assert [r[1] for r in rows if r[0] == number] == ["interrupted"]
    reruns = [r for r in rows if r[2] == params and r[0] != number]
    assert len(reruns) == 1 and reruns[0][1] != "interrupted"         # re-run once, by b
    assert _q(db, "select count(*) from trials where state = 'FAIL'")[0][0] == 1
    assert any("stopped beating" in l for l in b.lines)
    assert not servers_in(tmp_path, "sim-serve")
