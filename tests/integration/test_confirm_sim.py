"""Confirmation on the labelled simulator (real processes, HTTP and SQLite): a flagged study is not
exported unconfirmed; `run` on a finished study confirms it (the hook at the end of the study loop);
`autotune confirm` adds rounds; repeats are interleaved rows of their own with one fresh seed per round;
Optuna's values stay the first runs'; `show` and `export` speak of the confirmed medians and the verdict."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path




def _spec(sim_spec) -> Path:
    return sim_spec(
        "conf", engine={"time_scale": 50}, workload={"kind": "random", "input_len": 256, "output_len": 32},
        search_space="default",
        # two steps and no refinement against a 0.1 % bracket limit: every first run is flagged wide_bracket
        load={"max_steps": 2, "requests_per_step": 16, "warmup": 1, "min_waves": 1, "refine_steps": 0,
              "max_bracket": 0.001},
        confirm={"top_k": 1, "repeats": 3},
        # trial 1 is fixed (each process seeds its sampler differently; a sampled candidate might break a
        # known constraint and leave the numbering to chance)
        enqueue=[{"max_num_seqs": 64, "max_num_batched_tokens": 8192}])


def _q(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_confirm_on_the_simulator(tmp_path: Path, servers_in, sim_spec, autotune_cli) -> None:
    spec, db = _spec(sim_spec), tmp_path / "conf.db"
    url = f"sqlite:///{db}"
    p = autotune_cli("run", "--study", str(spec), "--n-trials", "2", "--no-progress", "--no-confirm", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    flags = [json.loads(f) for (f,) in _q(db, "select measurement_flags from autotune_trials where state = 'ok'")]
    assert flags and all("wide_bracket" in f for f in flags)
    assert _q(db, "select count(*) from autotune_confirmations") == [(0,)]

    # every feasible trial is flagged and nothing is confirmed: no export, one line, exit 1
    p = autotune_cli("export", "--storage", url, "--format", "vllm-yaml", "-o", str(tmp_path / "x.yaml"), cwd=tmp_path)
    assert p.returncode == 1 and "autotune confirm" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.yaml").exists()
    p = autotune_cli("export", "--storage", url, "--format", "json", "--trial", "1", "-o", "-", cwd=tmp_path)
    assert p.returncode == 1 and "is not confirmed" in p.stderr
    values_before = _q(db, "select trial_id, objective, value from trial_values order by 1, 2")
    # before it runs, `show` says what the confirmation will repeat and each round's time by the first runs
    to_run = json.loads(autotune_cli("show", "--storage", url, "--json", cwd=tmp_path).stdout)["confirmation_to_run"]
    assert to_run.startswith("to run: #0, #1; 6 repeat(s) left: round 1 ~"), to_run
    assert "round 3 ~" in to_run and "a round runs whole" in to_run

    # the same run command on a finished study: no new trial, the confirmation runs (the study loop's hook)
    p = autotune_cli("run", "--study", str(spec), "--n-trials", "2", "--no-progress", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "confirmation: #0, #1 x 3 rounds" in p.stderr
    rows = _q(db, "select c.round, c.position, c.seed, t.number, c.state from autotune_confirmations c "
                  "join autotune_trials t on t.id = c.trial_id order by c.started_at, c.id")
    assert [(r[0], r[3]) for r in rows] == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]   # A B, B A, A B
    seeds = {r[0]: {x[2] for x in rows if x[0] == r[0]} for r in rows}
    assert all(len(s) == 1 for s in seeds.values()) and len({min(s) for s in seeds.values()}) == 3
    assert 0 not in {x[2] for x in rows}                      # fresh prompts: not the first runs' seed
    # each repeat's capacity search starts at its first run's highest met load (no probe at one stream)
    first = {n: json.loads(c)["bracket"][0] for n, c in _q(db, "select number, capacity from autotune_trials")}
    starts = _q(db, "select t.number, c.capacity from autotune_confirmations c join autotune_trials t on t.id = c.trial_id")
    assert starts and all(json.loads(c)["steps"][0]["load"] == int(first[n]) for n, c in starts)
    assert _q(db, "select count(*) from trials where state = 'COMPLETE'") == [(2,)]     # not counted as trials
    assert _q(db, "select trial_id, objective, value from trial_values order by 1, 2") == values_before

    # autotune confirm adds a round; the rows already there are kept
    p = autotune_cli("confirm", "--storage", url, "--repeats", "4", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "(2 repeat(s) to run)" in p.stderr
    assert _q(db, "select round, count(*) from autotune_confirmations group by round") == [(0, 2), (1, 2), (2, 2), (3, 2)]
    p = autotune_cli("confirm", "--storage", url, "--repeats", "2", cwd=tmp_path)
    assert p.returncode == 2 and "at least 3" in p.stderr
    # a repeat that cannot finish before --timeout is not started; the next call runs it
    p = autotune_cli("confirm", "--storage", url, "--repeats", "5", "--timeout", "1s", cwd=tmp_path)
    assert p.returncode == 0 and "stopped by the timeout: 2 repeat(s) left" in p.stderr, p.stderr
    assert "stopped by timeout (run again to continue)" in p.stdout
    assert _q(db, "select count(*) from autotune_confirmations") == [(8,)]
    p = autotune_cli("confirm", "--storage", url, "--timeout", "soon", cwd=tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "timeout 'soon'" in p.stderr

    show = json.loads(autotune_cli("show", "--storage", url, "--json", cwd=tmp_path).stdout)
    assert set(show["confirmations"]) == {"0", "1"} and show["pareto_front_confirmed"] is True
    assert show["confirmation_to_run"] is None                 # done: nothing left to run
    assert show["confirmation_outlook"] == []                  # nor anything left to decide
    text = autotune_cli("show", "--storage", url, cwd=tmp_path).stdout
    assert "4 repeat(s)" in text and "first run" in text
    # every repeat kept its own telemetry, so memory is weighed over all five runs, not the first alone
    assert all(json.loads(t)["source"] == "sim" for (t,) in _q(db, "select telemetry from autotune_confirmations"))
    assert all(c["least_headroom"]["runs"] == 5 for c in show["confirmations"].values())
    assert "peak memory over 5 runs: least free" in text
    out = tmp_path / "best.yaml"
    p = autotune_cli("export", "--storage", url, "--format", "vllm-yaml", "-o", str(out), cwd=tmp_path)
    # the simulator's repeats neither crash nor break the SLO at one stream: both stay, and the export is
    # the best confirmed median whose verdict is not "worse" (the baseline when none beats it)
    assert p.returncode == 0, p.stderr
    assert all(c["survives"] for c in show["confirmations"].values())
    head = out.read_text()
    assert "# confirmed: 4 repeats on fresh servers" in head and f"trial {show['best']} " in head
    if show["best"] != 0:
        assert "# against the baseline: capacity_tps x" in head and "paired rounds" in head
        assert not show["confirmations"][str(show["best"])]["verdict"][0]["worse"]
    else:
        assert "# this is the baseline (vLLM's defaults): no candidate beat it after confirmation: #1" in head
    assert not servers_in(tmp_path, "sim-serve")
