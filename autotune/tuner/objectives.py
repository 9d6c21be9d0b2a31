"""From a trial's measurements to Optuna's objective values and constraints.

A failed candidate is a COMPLETE trial with `failure` violated (DESIGN.md, principle 2), so the
sampler learns to avoid its region. It still needs objective values: placeholders no measured trial can
lose to — the worst value seen so far — kept in Optuna only and never shown as measurements.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from autotune.spec import OBJECTIVES
from autotune.slo import SLO


def constraint_keys(slo: SLO, headroom: bool) -> list[str]:
    return [*slo.keys, "failure", *(["headroom"] if headroom else [])]


def measured_constraints(slo: SLO, metrics: Mapping[str, float], headroom_value: float | None,
                         headroom: bool) -> dict[str, float]:
    out = {**slo.margins(metrics), "failure": 0.0}
    if headroom:
        out["headroom"] = headroom_value if headroom_value is not None else 0.0
    return out


def failure_constraints(slo: SLO, headroom: bool) -> dict[str, float]:
    """Nothing was measured: the SLO terms are unknown (0 = not held against it), failure is violated."""
    out = {k: 0.0 for k in slo.keys}
    out["failure"] = 1.0
    if headroom:
        out["headroom"] = 0.0
    return out


def placeholder_values(objectives: Sequence[str], history: Iterable[Sequence[float]]) -> list[float]:
    """Worst value seen so far for each objective (or a value worse than any plausible measurement)."""
    seen = [list(v) for v in history if v is not None and len(v) == len(objectives)]
    out: list[float] = []
    for i, name in enumerate(objectives):
        column = [v[i] for v in seen]
        if OBJECTIVES[name] == "maximize":
            out.append(min(column) if column else 0.0)
        else:
            out.append(max(column) if column else 1e9)
    return out


def pick(objectives: Sequence[str], observed: Mapping[str, float]) -> list[float] | None:
    """The study's objective vector, or None when a needed value was not measured."""
    if any(observed.get(name) is None for name in objectives):
        return None
    return [float(observed[name]) for name in objectives]
