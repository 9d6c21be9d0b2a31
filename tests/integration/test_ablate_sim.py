"""`autotune ablate` end to end on the labelled simulator (real processes, HTTP and SQLite): from the command
line to a derived study in a file of its own, whose configurations are the baseline, the trial whole and
the one knob alone, each run once and then in every paired round; a second call resumes and measures
nothing. Which configuration wins is not asserted: that is the simulator's, and not what is tested."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


def _q(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_ablate_on_the_simulator(tmp_path: Path, servers_in, sim_spec, autotune_cli) -> None:
    spec = sim_spec(
        "abl", engine={"time_scale": 50}, workload={"kind": "random", "input_len": 256, "output_len": 32},
        load={"max_steps": 2, "requests_per_step": 16, "warmup": 1, "min_waves": 1, "refine_steps": 0},
        confirm={"enabled": False}, warm_start=False,
        # trial 1 is fixed, with two knobs (a sampled one might break a known constraint)
        enqueue=[{"max_num_seqs": 16, "gpu_memory_utilization": 0.85}])
    p = autotune_cli("run", "--study", str(spec), "--n-trials", "2", "--no-progress", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    args = ["ablate", "--study", str(spec), "--trial", "1", "--knobs", "max_num_seqs", "--no-progress"]
    p = autotune_cli(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    db = tmp_path / "abl-ablate-1.db"
    assert _q(db, "select name from autotune_studies") == [("abl-ablate-1",)]
    flags = {n: json.loads(f) for n, f in _q(db, "select number, flags from autotune_trials")}
    assert flags[0] == [] and sorted(flags[1]) == sorted(["--max-num-seqs", "16", "--gpu-memory-utilization", "0.85"])
    assert flags[2] == ["--max-num-seqs", "16"]         # the knob alone, nothing of the trial's other knob
    # every configuration in every round, the losing one too (confirm.every), one seed per round
    rounds = _q(db, "select t.number, count(distinct c.round) from autotune_confirmations c "
                    "join autotune_trials t on t.id = c.trial_id group by t.number order by t.number")
    assert rounds == [(0, 3), (1, 3), (2, 3)], p.stdout
    assert _q(db, "select count(distinct seed) from autotune_confirmations") == [(3,)]
    said = p.stdout.splitlines()
    assert "  gpu_memory_utilization: default (baseline) -> 0.85 (trial 1), not taken apart (--knobs)" in said
    assert any(line.startswith("  trial 1 whole: #1: capacity_tps x") for line in said), p.stdout
    assert any(line.startswith("  max_num_seqs=16: #2: capacity_tps x") for line in said), p.stdout
    # the study's own file still holds one study: show needs no --study-name
    assert autotune_cli("show", "--storage", f"sqlite:///{tmp_path}/abl.db", cwd=tmp_path).returncode == 0
    # the same command again resumes a finished ablation: its summary, no server started
    again = autotune_cli(*args, cwd=tmp_path)
    assert again.returncode == 0 and "starting sim" not in again.stdout, again.stdout + again.stderr
    assert _q(db, "select count(*) from autotune_confirmations") == [(9,)]
    assert not servers_in(tmp_path, "sim-serve")
