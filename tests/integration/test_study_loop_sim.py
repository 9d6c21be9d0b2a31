"""The study loop's interrupt, timeout and resume paths, on the labelled simulator (real processes,
real HTTP, real SQLite; seconds per trial instead of minutes)."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import pytest


def _spec(sim_spec) -> Path:
    """Confirmation off: this file is about interrupts and resume (confirmation: test_confirm_sim.py)."""
    return sim_spec("loop", engine={"time_scale": 20}, confirm={"enabled": False})


def _evidence(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("select number, state, cause, params, role from autotune_trials order by number").fetchall()


def test_sigterm_interrupts_then_resume_finishes_without_replaying(autotune_run, servers_in, sim_spec,
                                                                   tmp_path: Path) -> None:
    spec = _spec(sim_spec)
    args = ["run", "--study", str(spec), "--n-trials", "5", "--no-progress"]
    first = autotune_run(args, tmp_path)
    first.wait_for(lambda ls: any(l.startswith("[trial 2]") for l in ls) and "capacity search" in ls[-1], 180)
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish(60) == 143
    assert "stopped by SIGTERM" in first.lines[-1]
    assert not servers_in(tmp_path, "sim-serve")
    rows = _evidence(tmp_path / "loop.db")
    assert rows[-1][1:3] == ("interrupted", "interrupted")
    interrupted_params = json.loads(rows[-1][3])

    second = autotune_run(args, tmp_path)
    assert second.finish(300) == 0, "\n".join(second.lines)
    rows = _evidence(tmp_path / "loop.db")
    with sqlite3.connect(tmp_path / "loop.db") as conn:
        states = [s for (s,) in conn.execute("select state from trials order by number")]
    assert states.count("COMPLETE") == 5 and states.count("FAIL") == 1
    assert json.loads(rows[3][3]) == interrupted_params        # the interrupted candidate ran again first
    searched = [r[3] for r in rows if r[4] == "search" and r[1] != "interrupted"]
    assert len(searched) == len(set(searched))                  # the resumed sampler did not replay candidates
    assert not servers_in(tmp_path, "sim-serve")


def test_timeout_stops_this_invocation_and_the_next_one_continues(autotune_run, servers_in, sim_spec,
                                                                  tmp_path: Path) -> None:
    spec = _spec(sim_spec)
    first = autotune_run(["run", "--study", str(spec), "--n-trials", "50", "--timeout", "25s", "--no-progress"], tmp_path)
    assert first.finish(120) == 0
    assert "stopped by timeout" in first.lines[-1]
    evidence = _evidence(tmp_path / "loop.db")
    done = [r for r in evidence if r[1] != "interrupted"]
    # trials finished in 25 s, or (a machine slow enough) the first one cut by the timeout and re-queued
    assert len(done) < 50 and (len(done) >= 1 or [r[1] for r in evidence] == ["interrupted"]), evidence
    second = autotune_run(["run", "--study", str(spec), "--n-trials", str(len(done) + 1), "--no-progress"], tmp_path)
    assert second.finish(120) == 0, "\n".join(second.lines)
    assert len([r for r in _evidence(tmp_path / "loop.db") if r[1] != "interrupted"]) == len(done) + 1
    assert not servers_in(tmp_path, "sim-serve")


@pytest.mark.parametrize("signame", ["SIGINT"])
def test_ctrl_c_is_handled_like_sigterm(autotune_run, servers_in, sim_spec, tmp_path: Path,
                                        signame: str) -> None:
    spec = _spec(sim_spec)
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "3", "--no-progress"], tmp_path)
    run.wait_for(lambda ls: any(l.startswith("[trial 1]") for l in ls) and "capacity search" in ls[-1], 180)
    run.proc.send_signal(getattr(signal, signame))
    assert run.finish(60) == 130
    assert _evidence(tmp_path / "loop.db")[-1][1] == "interrupted"
    assert not servers_in(tmp_path, "sim-serve")
