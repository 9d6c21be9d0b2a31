"""Confirmed figures, the verdict against the baseline and measurement flags, read defensively.

The confirmation work (issue 11, `autotune_confirmations` and `autotune_trials.measurement_flags`) may
or may not be in a given database: an older study has neither. Everything here reads the tables through
SQLAlchemy's inspector and returns "not confirmed" (empty) when a table or column is absent, so that the
report, the exports and `diff` show confirmed figures where they exist and never fail where they do not.
This is the one module that knows their layout; when issue 11's own reader lands, it replaces these
functions and nothing else changes.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine

from autotune.store.models import StudyRecord

CONFIRMATIONS = "autotune_confirmations"
NOT_CONFIRMED = "not confirmed"


@dataclass
class Confirmed:
    """A trial's confirmation repeats: per objective the values of the repeats that measured."""

    number: int
    values: dict[str, list[float]] = field(default_factory=dict)
    rounds: dict[str, dict[Any, float]] = field(default_factory=dict)   # objective -> round -> value
    failed: int = 0                      # repeats that did not measure (failed to start, crashed)
    verdict: str | None = None           # a verdict the confirmation work stored with the rows

    def median(self, objective: str) -> float | None:
        vals = self.values.get(objective)
        return statistics.median(vals) if vals else None

    def spread(self, objective: str) -> tuple[float, float] | None:
        vals = self.values.get(objective)
        return (min(vals), max(vals)) if vals else None

    @property
    def repeats(self) -> int:
        return max((len(v) for v in self.values.values()), default=0) + self.failed


@dataclass
class Gain:
    """B against A on one objective: the ratio of confirmed medians, and its interval over paired rounds
    (the lowest and highest per-round ratio) when the repeats carry a round number."""

    objective: str
    ratio: float
    low: float | None
    high: float | None
    rounds: int

    def beyond_noise(self, maximize: bool) -> bool:
        if self.low is None or self.high is None or self.rounds < 3:
            return False
        return self.low > 1.0 if maximize else self.high < 1.0

    def text(self, maximize: bool) -> str:
        interval = (f" [{self.low:.3f}, {self.high:.3f}] over {self.rounds} paired rounds"
                    if self.low is not None and self.high is not None else " (no paired rounds)")
        word = "gain beyond noise" if self.beyond_noise(maximize) else "no gain beyond noise"
        return f"x{self.ratio:.3f}{interval}: {word}"


def _columns(engine: Engine, table: str) -> set[str]:
    insp = inspect(engine)
    if not insp.has_table(table):
        return set()
    return {c["name"] for c in insp.get_columns(table)}


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def measurement_flags(engine: Engine, study: StudyRecord) -> dict[int, list[str]]:
    """trial number -> its measurement flags (`client_saturated`, `prefix_hits`, `wide_bracket`,
    `overlapped`); empty when the column does not exist."""
    if "measurement_flags" not in _columns(engine, "autotune_trials"):
        return {}
    out: dict[int, list[str]] = {}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT number, measurement_flags FROM autotune_trials WHERE study_id = :s"),
                            {"s": study.id})
        for number, flags in rows:
            flags = _json(flags)
            if flags:
                out[int(number)] = [str(f) for f in flags]
    return out


def confirmations(engine: Engine, study: StudyRecord) -> dict[int, Confirmed]:
    """trial number -> its confirmation repeats; empty when the table does not exist. A row links to its
    trial by `trial_id` (autotune_trials.id) or by `study_id` + `number` (or `trial_number`); its values
    are an `objectives` (or `values`) JSON mapping, or one column per objective."""
    cols = _columns(engine, CONFIRMATIONS)
    if not cols:
        return {}
    names = [o for o, _ in study.objectives]
    with engine.connect() as conn:
        if "trial_id" in cols:
            rows = conn.execute(text(f"SELECT t.number AS _number, c.* FROM {CONFIRMATIONS} c "
                                     "JOIN autotune_trials t ON t.id = c.trial_id WHERE t.study_id = :s"),
                                {"s": study.id}).mappings().all()
        elif "study_id" in cols and (link := next((c for c in ("number", "trial_number") if c in cols), None)):
            rows = conn.execute(text(f"SELECT {link} AS _number, * FROM {CONFIRMATIONS} WHERE study_id = :s"),
                                {"s": study.id}).mappings().all()
        else:
            return {}
    out: dict[int, Confirmed] = {}
    for row in rows:
        c = out.setdefault(int(row["_number"]), Confirmed(int(row["_number"])))
        packed = next((c for c in ("objectives", "values") if c in row), None)
        values = _json(row[packed]) if packed else {n: row.get(n) for n in names}
        if row.get("verdict"):
            c.verdict = str(row["verdict"])
        measured = isinstance(values, Mapping) and any(values.get(n) is not None for n in names)
        if not measured or (row.get("state") not in (None, "ok", "infeasible")):
            c.failed += 1
            continue
        for n in names:
            v = values.get(n)
            if v is not None:
                c.values.setdefault(n, []).append(float(v))
                if row.get("round") is not None:
                    c.rounds.setdefault(n, {})[row["round"]] = float(v)
    return out


def gain(a: Confirmed | None, b: Confirmed | None, objective: str) -> Gain | None:
    """B over A on `objective` from confirmed repeats; None unless both were confirmed."""
    if a is None or b is None:
        return None
    ma, mb = a.median(objective), b.median(objective)
    if not ma or mb is None:
        return None
    ra, rb = a.rounds.get(objective, {}), b.rounds.get(objective, {})
    paired = [rb[r] / ra[r] for r in ra.keys() & rb.keys() if ra[r]]
    low, high = (min(paired), max(paired)) if paired else (None, None)
    return Gain(objective, mb / ma, low, high, len(paired))


def verdict(study: StudyRecord, baseline: Confirmed | None, trial: Confirmed | None) -> str:
    """One line: the stored verdict, else the gain on the first objective from the repeats, else
    "not confirmed"."""
    if trial is not None and trial.verdict:
        return trial.verdict
    objective, direction = study.objectives[0]
    g = gain(baseline, trial, objective)
    if g is None:
        return NOT_CONFIRMED
    return f"{objective} against the baseline: {g.text(direction == 'maximize')}"
