"""A database written before measurement flags and confirmations existed keeps opening: the committed
H200 study (benchmarks/gpu/) gains the new column and table on open, and reads as "not recorded"."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

from autotune.store.migrate import migrate
from autotune.store.repository import ResultStore
from autotune.tuner.verdict import spread_rule, summarize_confirmations
from autotune.tuner.winner import export_choice

OLD_DB = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "h200-llama8b.db"


def _copy(src: Path, db: Path) -> None:
    """A committed study DB copied out to `db`, unzipped where it is committed gzipped."""
    with (gzip.open(src) if src.suffix == ".gz" else open(src, "rb")) as fin, open(db, "wb") as out:
        shutil.copyfileobj(fin, out)


def test_the_committed_h200_study_opens_and_gains_the_new_column(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    shutil.copy(OLD_DB, db)
    with sqlite3.connect(db) as conn:
        cols = {r[1] for r in conn.execute("pragma table_info(autotune_trials)")}
    assert "measurement_flags" not in cols            # written by an older autotune
    store = ResultStore(f"sqlite:///{db}", create=False)
    study = store.resolve_study(None)
    trials = store.trials(study.id)
    assert trials and all(t.measurement_flags is None for t in trials)
    assert store.confirmations(study.id) == []
    choice = export_choice(study, trials, [])
    assert choice.trial is not None and "UNCONFIRMED" in choice.why
    assert migrate(store.engine) == []    # idempotent


def test_every_committed_study_database_opens_with_show_and_export(tmp_path: Path) -> None:
    # the knobs studies are committed gzipped (a raw decode study is 20 MB): they must open too
    dbs = sorted([*OLD_DB.parent.rglob("*.db"), *OLD_DB.parent.rglob("*.db.gz")])
    assert len(dbs) >= 2 and any(src.suffix == ".gz" for src in dbs)
    for i, src in enumerate(dbs):
        db = tmp_path / f"{i}.db"
        _copy(src, db)
        store = ResultStore(f"sqlite:///{db}", create=False)
        names = store.study_names()
        assert names, src
        for name in names:
            study = store.resolve_study(name)
            trials = store.trials(study.id)
            choice = export_choice(study, trials, store.confirmations(study.id))
            assert choice.why, (src, name)


def test_the_h100_decode_study_keeps_the_range_rule_stamped_or_not(tmp_path: Path) -> None:
    """Its first rounds were stored before the spread rule was stamped, so its next round (6, session 37)
    stamped it `range`. Stamped, or with the column dropped as an older autotune wrote it, it gives the
    five-round verdict RESULTS.md quotes on the range, not the gap rule's; the stamp never changes."""
    verdict = ("capacity_tps x1.336 [1.077, 1.657] over 5 paired rounds, spread 29.9% (range): better")
    stamped, unstamped = tmp_path / "stamped.db", tmp_path / "unstamped.db"
    for db in (stamped, unstamped):
        _copy(OLD_DB.parent / "knobs" / "h100-decode.db.gz", db)
    with sqlite3.connect(unstamped) as conn:
        conn.execute("alter table autotune_studies drop column spread_rule")
    for db, stored in ((stamped, "range"), (unstamped, None)):
        store = ResultStore(f"sqlite:///{db}", create=False)
        study = store.resolve_study(None)
        assert study.spread_rule == stored and spread_rule(study) == "range", db
        confirmed = summarize_confirmations(study, store.trials(study.id), store.confirmations(study.id))
        assert confirmed[1].verdicts[0].text() == verdict, db
        assert store.stamp_spread_rule(study.id, "gap", "range") == "range"
