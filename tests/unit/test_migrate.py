"""A database written before the scheduler (the committed H200 study) opens, gains the new nullable
columns, and `show` still reads it."""

from __future__ import annotations

import argparse
import shutil
import sqlite3
from pathlib import Path

from autotune.report.show import show_command
from autotune.store.migrate import missing_columns
from autotune.store.repository import ResultStore, make_engine

OLD_DB = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "h200-llama8b.db"


def test_an_old_database_gains_the_new_columns_and_shows(tmp_path: Path, capsys) -> None:
    db = tmp_path / "old.db"
    shutil.copy(OLD_DB, db)
    url = f"sqlite:///{db}"
    lacking = missing_columns(make_engine(url))
    assert {"host", "lease", "overlapped", "measurement_flags"} <= set(lacking["autotune_trials"])
    store = ResultStore(url, create=False)
    assert missing_columns(store.engine) == {}
    trials = store.trials(store.resolve_study(None).id)
    assert trials and all(t.host is None and t.lease is None for t in trials)
    with sqlite3.connect(db) as conn:       # the evidence itself is untouched
        before = sqlite3.connect(OLD_DB).execute("select count(*), sum(kv_cache_tokens) from autotune_trials").fetchone()
        assert conn.execute("select count(*), sum(kv_cache_tokens) from autotune_trials").fetchone() == before
    assert show_command(argparse.Namespace(storage=url, study_name=None, json=False)) == 0
    assert "Pareto front" in capsys.readouterr().out
    ResultStore(url, create=False)          # opening again adds nothing and fails on nothing
