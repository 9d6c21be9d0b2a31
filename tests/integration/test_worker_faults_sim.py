"""Each trial's measurement runs in a worker process (issue 22), on the labelled simulator (real
processes, HTTP and SQLite): a worker SIGKILLed mid-load fails only its own trial, with its cause, and the
candidate is measured again; a daemon SIGKILLed mid-load leaves no worker and no server; an interrupt
(the deadline) that arrives after a trial's last load step leaves that trial `ok` with its measurement."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.engine.process import find_free_port
from autotune.node.worker import PROCESS_NAME

REPO = Path(__file__).resolve().parents[2]


def _q(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def _family(pid: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(measurement workers, simulator servers) below `pid`."""
    workers, servers = [], []
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return [], []
    for p in kids:
        try:
            if p.name() == PROCESS_NAME:
                workers.append(p)
            elif "sim-serve" in " ".join(p.cmdline()):
                servers.append(p)
        except psutil.Error:
            continue
    return workers, servers


def _in_load(lines: list[str], n: int) -> bool:
    """`n` trials have reported a load step and none of those has finished since."""
    stepped = {m[1] for line in lines if (m := re.match(r"\s*\[trial (\d+)\] capacity search: ", line))}
    ended = {m[1] for line in lines if (m := re.match(r"\[trial (\d+)\] (ok|infeasible|failed|interrupted)", line))}
    return len(stepped - ended) >= n


def test_a_killed_worker_fails_only_its_trial_and_the_candidate_runs_again(autotune_run, servers_in, sim_spec,
                                                                           tmp_path: Path) -> None:
    # 5x: a step lasts seconds, so both trials are still in their load when the kill lands
    spec = sim_spec("wk", engine={"time_scale": 5}, confirm={"enabled": False},
                    load={"max_steps": 3, "requests_per_step": 40})
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "3", "--gpus", "0-1", "--parallel", "2",
                        "--no-progress"], tmp_path)
    run.wait_for(lambda ls: _in_load(ls, 2) and len(_family(run.proc.pid)[0]) == 2, 300)
    workers, _ = _family(run.proc.pid)
    victim = workers[0].pid
    os.kill(victim, signal.SIGKILL)
    assert run.finish(600) == 0, "\n".join(run.lines)
    db = tmp_path / "wk.db"
    rows = _q(db, "select number, state, cause, detail, params from autotune_trials order by number")
    died = [r for r in rows if r[2] == "worker_died"]
    assert len(died) == 1 and died[0][1] == "failed", rows
    assert f"(pid {victim}) was killed by SIGKILL" in died[0][3]
    number, params = died[0][0], json.loads(died[0][4])
    optuna = dict(_q(db, "select number, state from trials"))
    assert optuna[number] == "FAIL"                                   # not told: neither counted nor learned
    again = [r for r in rows if r[0] > number and json.loads(r[4]) == params and r[1] != "interrupted"]
    assert again and again[0][1] in ("ok", "infeasible"), rows       # the candidate was measured by a later trial
    others = [r for r in rows if r[0] != number]
    assert all(r[2] != "worker_died" and r[1] in ("ok", "infeasible") for r in others), rows
    assert list(optuna.values()).count("COMPLETE") == 3
    assert not servers_in(tmp_path, "sim-serve")
    assert not any(p.pid == victim for p in psutil.process_iter())


def test_a_killed_daemon_leaves_no_worker_and_no_server(autotune_run, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    import yaml

    spec = yaml.safe_load((REPO / "benchmarks" / "scale" / "scenario.yaml").read_text())
    spec.update(name="kd")
    spec["engine"]["time_scale"] = 5
    path = tmp_path / "kd.yaml"
    path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'q.db'}"
    sub = subprocess.run([sys.executable, "-m", "autotune", "submit", str(path), "--n-trials", "20", "--storage", url],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert sub.returncode == 0, sub.stderr
    d = autotune_run(["daemon", "--gpus", "0-1", "--storage", url, "--poll", "0.5",
                      "--listen", f"127.0.0.1:{find_free_port()}"], tmp_path)
    d.wait_for(lambda ls: _in_load(ls, 2) and len(_family(d.proc.pid)[0]) == 2, 300)
    workers, servers = _family(d.proc.pid)
    assert len(workers) == 2 and len(servers) >= 2
    d.proc.send_signal(signal.SIGKILL)
    d.finish(30)
    gone, alive = psutil.wait_procs(workers + servers, timeout=30)
    assert alive == [], f"outlived the daemon: {[(p.pid, p.name()) for p in alive]}"


def test_an_interrupt_after_the_last_step_leaves_the_trial_ok(sim_spec, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The deadline arrives right after a trial's last load step (two steps at most, no refinement: the
    second step's line is the last; the signal the deadline's timer sends is sent from that line). The
    trial is recorded ok with its measurement; no other trial starts; the run says it was stopped."""
    from autotune.cli import main
    from autotune.tuner.progress import Progress

    spec = sim_spec("late", confirm={"enabled": False}, load={"max_steps": 2, "refine_steps": 0})
    phase = Progress.phase
    steps: list[str] = []

    def deadline_after_the_last_step(self: Progress, text: str) -> None:
        phase(self, text)
        if "capacity search: concurrency" in text:
            steps.append(text)
            if len(steps) == 2:
                os.kill(os.getpid(), signal.SIGUSR1)   # what the --timeout timer sends (node/interrupts.py)

    monkeypatch.setattr(Progress, "phase", deadline_after_the_last_step)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--study", str(spec), "--n-trials", "3", "--timeout", "1h", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "stopped by timeout" in out and len(steps) == 2
    db = tmp_path / "late.db"
    rows = _q(db, "select number, state, cause, objectives, client from autotune_trials")
    assert len(rows) == 1 and rows[0][1] in ("ok", "infeasible") and rows[0][2] != "interrupted", rows
    assert json.loads(rows[0][3]) and json.loads(rows[0][4])["cpu_s"] > 0
    assert _q(db, "select state from trials") == [("COMPLETE",)]
