"""What the rounds a confirmation still has to run can decide, said before they run.

A confirmation stopped by `--timeout` leaves a user with a choice: spend another lease of GPU time on the
rounds left, or stop. What those rounds can change is already fixed by the rounds that ran: with three
paired rounds, two ratios of x0.954 and x1.025 leave no third one that makes the interval clear 1, while
x1.065 and x1.083 need only a third of x1.034 (the H100 chat study after its round 2). So for each
candidate still pending this finds the smallest ratio to the baseline that its rounds left must reach for
the verdict on the study's first objective to come out "better", by the verdict's own arithmetic
(`verdict.objective_verdict`, the study's spread rule), or that none up to `MAX_FACTOR` does.

The assumptions, said beside the result: every round left gives the same ratio, and the baseline's
repeats to come land at its median so far. With one round left the first is no assumption, and a
candidate that cannot clear 1 cannot whatever the baseline does (the interval is of ratios alone). It is
also what a user writes down before a round runs, so that the round cannot be read to suit afterwards
(the H100 decode study's round 6, benchmarks/gpu/knobs/RESULTS.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from autotune.store.models import StudyRecord
from autotune.tuner.verdict import Confirmed, objective_verdict, spread_rule

MAX_FACTOR = 2.0    # ratios searched: up to x2 (or down to x0.5 for an objective minimized)
STEP = 0.001


@dataclass
class Outlook:
    trial: int
    so_far: list[float]         # its paired ratios to the baseline, in round order
    rounds_left: int
    needed: float | None        # the ratio each round left must reach for "better"; None: none within MAX_FACTOR

    def to_json(self) -> dict[str, object]:
        return {"trial": self.trial, "so_far": self.so_far, "rounds_left": self.rounds_left,
                "needed_ratio": self.needed}


def _values(c: Confirmed, name: str) -> dict[int, float]:
    return {r.round: float(r.objectives[name]) for r in c.rows
            if r.state == "ok" and r.objectives and r.objectives.get(name) is not None}


def baseline_median(study: StudyRecord, base: Confirmed) -> float | None:
    """The baseline's median so far on the first objective: where its repeats to come are assumed to land."""
    vals = list(_values(base, study.objectives[0][0]).values())
    return statistics.median(vals) if vals else None


def outlook(study: StudyRecord, confirmed: dict[int, Confirmed], baseline_number: int,
            repeats: int) -> list[Outlook]:
    """For each pending candidate with rounds left (of `repeats` paired with the baseline), what they must show."""
    name, direction = study.objectives[0]
    base = confirmed.get(baseline_number)
    if base is None:
        return []
    base_vals, b = _values(base, name), baseline_median(study, base)
    if not b:
        return []
    rule, out = spread_rule(study), []
    for n, c in sorted(confirmed.items()):
        if c is base or not c.pending:
            continue
        own = _values(c, name)
        pairs = [(base_vals[k], v) for k, v in sorted(own.items()) if k in base_vals]
        left = repeats - len(pairs)
        if left <= 0:
            continue
        needed = None
        for k in range(round((MAX_FACTOR - 1.0) / STEP) + 1):
            f = 1.0 + k * STEP
            r = f if direction == "maximize" else 1.0 / f
            v = objective_verdict(name, direction, pairs + [(b, b * r)] * left,
                                  list(base_vals.values()) + [b] * left, list(own.values()) + [b * r] * left, rule)
            if v.better:
                needed = round(r, 3)
                break
        out.append(Outlook(n, [round(v / a, 3) for a, v in pairs], left, needed))
    return out
