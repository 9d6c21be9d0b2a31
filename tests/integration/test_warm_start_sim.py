"""The twin's ranking runs beside the baseline's server start (labelled simulator, real processes, real
HTTP, the real twin): the baseline's load waits until the ranking is done, so the ranking never runs
beside a measurement, and the picks still run right after the baseline."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna


def test_the_baseline_starts_while_the_twin_ranks_and_its_load_waits_for_the_ranking(autotune_run, sim_spec,
                                                                                     tmp_path: Path) -> None:
    # stream_interval: a knob the twin does not model (perfmodel/knobs.py), left to the sampler in the picks
    space = {"params": {"gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95},
                        "max_num_seqs": {"type": "int", "low": 8, "high": 256, "log": True},
                        "stream_interval": {"type": "categorical", "choices": [1, 4, 16], "default": 1}}}
    spec = sim_spec("warm", confirm={"enabled": False}, warm_start={"from": "twin", "k": 2, "candidates": 100},
                    search_space=space)
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "3", "--no-progress"], tmp_path)
    assert run.finish(300) == 0, "\n".join(run.lines)
    lines = run.lines

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    ranking_starts, ranked = first("twin (simulated) ranking 100 candidates"), first("candidates ranked in")
    server_starts, load_starts = first("starting "), first("capacity search by")
    # the server was launched before the ranking ended; the first request only after it (100 candidates
    # take the twin 10-20 s on two cores, the simulated server starts in 1-3 s: the baseline waited)
    waited = first("waiting for the twin's ranking to finish before the load")
    assert ranking_starts < server_starts < waited < ranked < load_starts, "\n".join(lines)
    with sqlite3.connect(tmp_path / "warm.db") as conn:
        roles = [r for (r,) in conn.execute("select role from autotune_trials order by number")]
    assert roles == ["baseline", "warm_start", "warm_start"]
    study = optuna.load_study(study_name="warm", storage=f"sqlite:///{tmp_path}/warm.db")
    for t in study.trials[1:]:
        fixed = t.system_attrs.get("fixed_params") or {}
        # the twin fixed what it models; the sampler drew the rest: the pick still ran with a value
        assert "max_num_seqs" in fixed and "stream_interval" not in fixed, t.system_attrs
        assert "stream_interval" in t.params and "stream_interval" in t.user_attrs["enqueued"]
