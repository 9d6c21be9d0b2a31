"""benchmarks/gpu/best_met_step.py on the committed H100 decode study: its first reading must be the
verdict `show` gives (the same pairs, the same rule), and its second the figure RESULTS.md quotes."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
from pathlib import Path

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


def _script():
    spec = importlib.util.spec_from_file_location("best_met_step", GPU / "best_met_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_decode_verdict_read_at_the_best_met_step_is_still_better_but_smaller(tmp_path: Path) -> None:
    db = tmp_path / "decode.db"
    with gzip.open(GPU / "knobs" / "h100-decode.db.gz") as fin, open(db, "wb") as out:
        shutil.copyfileobj(fin, out)
    lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in _script().verdicts(str(db))}
    assert lines["h100-knobs-decode #1 (highest met load)"] == (
        "capacity_tps x1.336 [1.077, 1.657] over 5 paired rounds, spread 29.9% (range): better")
    assert lines["h100-knobs-decode #1 (best met step)"] == (
        "capacity_tps x1.237 [1.062, 1.440] over 5 paired rounds, spread 21.3% (range): better")
    assert lines["h100-knobs-decode #3 (best met step)"].endswith(
        "no gain beyond noise (the interval clears 1, but the difference 21.3% is below the spread 21.3% of one "
        "configuration's repeats)")
    assert len(lines) == 6      # #1, #3 and #4, each read both ways


def test_no_database_is_a_usage_error_with_exit_2(capsys) -> None:
    assert _script().main([]) == 2
    assert "best_met_step.py DB..." in capsys.readouterr().err
