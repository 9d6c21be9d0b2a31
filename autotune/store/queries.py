"""Questions asked of a finished (or running) study: which trials are feasible, which form the Pareto
front, which one is best. Answered from autotune's evidence, whose objective values are measurements
only, so a failed trial's placeholder can never be shown or exported as a result."""

from __future__ import annotations

from typing import Any, Sequence

from autotune.store.models import StudyRecord, TrialRecord


def wall_s(r: Any) -> float | None:
    """Seconds from a trial's or a repeat's start to its finish (any row with both columns); None while
    either is missing."""
    return (r.finished_at - r.started_at).total_seconds() if r.finished_at and r.started_at else None


def is_feasible(t: TrialRecord) -> bool:
    return t.state == "ok" and bool(t.objectives) and all(v <= 0 for v in (t.constraints or {}).values())


def _dominates(a: Sequence[float], b: Sequence[float], maximize: Sequence[bool]) -> bool:
    better_or_equal = all((x >= y) if mx else (x <= y) for x, y, mx in zip(a, b, maximize))
    strictly = any((x > y) if mx else (x < y) for x, y, mx in zip(a, b, maximize))
    return better_or_equal and strictly


def pareto_front(study: StudyRecord, trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    names = [o for o, _ in study.objectives]
    maximize = [d == "maximize" for _, d in study.objectives]
    feasible = [t for t in trials if is_feasible(t) and all(n in t.objectives for n in names)]
    vec = {t.number: [t.objectives[n] for n in names] for t in feasible}
    return [t for t in feasible
            if not any(_dominates(vec[o.number], vec[t.number], maximize) for o in feasible if o is not t)]


def best_trial(study: StudyRecord, trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """Feasible trial best on the first objective; ties go to the lower p99 TTFT."""
    name, direction = study.objectives[0]
    feasible = [t for t in trials if is_feasible(t) and name in t.objectives]
    if not feasible:
        return None
    sign = -1.0 if direction == "maximize" else 1.0
    return min(feasible, key=lambda t: (sign * t.objectives[name],
                                        (t.metrics or {}).get("p99_ttft_ms", float("inf"))))
