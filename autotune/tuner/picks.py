"""Which trials a confirmation repeats beside the baseline (tuner/confirm.py), and which it left out.

First `top_k`: the best feasible trial on the first objective, the best output-preserving one (when the
best changes output quality), the best one that costs nothing on the other objectives (when the best
does: its first run is worse than the baseline's beyond the noise floor on one of them), then the rest of
the Pareto front by the first objective. The third exists because the front's next members are often
the best one's neighbours: on the H200 chat study (an SLO on TTFT only) the two best first runs were
nearly the same config, x1.26 and x1.19 the defaults' capacity at x5.6 and x4.6 their p50 TPOT, and
repeating both would have told nothing about #4, x1.07 at the defaults' TPOT. Then, up to
`max_extra` more, the trials a first run cannot settle: those whose first run lies within the
measurement noise of the best first run, then those carrying a measurement flag, each group best first.
Flagged trials are candidates like any other: confirmation is what can clear them.

The noise is the larger of twice the baseline's repeat spread on the first objective and NOISE_FLOOR
(5 %). When a study's confirmation first picks, the baseline's repeats do not exist yet (it is repeated
in the same rounds as the candidates), so the floor is the noise; a continued or later confirmation
(`autotune confirm`, the same `run` again) uses the spread its stored baseline repeats measured, which
can only widen the circle. A trial that already has repeats stays in the plan whatever the picks say
now, so a confirmation that was cut short is always finished with the configurations it started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.store.queries import best_trial, is_feasible, pareto_front
from autotune.tuner.verdict import NOISE_FLOOR, first_run_costs, flags_of, quality_changing, relative_spread


@dataclass
class Picks:
    candidates: list[TrialRecord]                      # top-k, the extras, then trials already repeated
    extras: list[TrialRecord] = field(default_factory=list)
    left_out: list[tuple[TrialRecord, str]] = field(default_factory=list)   # close or flagged, over budget
    noise: float = NOISE_FLOOR
    noise_why: str = ""
    costless: str = ""     # why the best first run that costs nothing on the other objectives was picked


def noise_estimate(study: StudyRecord, trials: Sequence[TrialRecord],
                   rows: Sequence[ConfirmationRecord]) -> tuple[float, str]:
    """The relative noise of one first run on the first objective, and where the figure comes from."""
    name = study.objectives[0][0]
    base = next((t for t in trials if t.role == "baseline"), None)
    vals = [float(r.objectives[name]) for r in rows if base is not None and r.trial_id == base.id
            and r.state == "ok" and (r.objectives or {}).get(name) is not None]
    if len(vals) >= 2:
        spread = relative_spread(vals)
        if 2 * spread > NOISE_FLOOR:
            return 2 * spread, f"twice the baseline's repeat spread ({spread:.1%})"
        return NOISE_FLOOR, f"the {NOISE_FLOOR:.0%} floor (twice the baseline's repeat spread is {2 * spread:.1%})"
    return NOISE_FLOOR, f"the {NOISE_FLOOR:.0%} floor (no baseline repeats yet)"


def _pool(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    baseline = next((t for t in trials if t.role == "baseline"), None)
    return [t for t in trials if t.role != "baseline" and is_feasible(t)
            and not (baseline is not None and (t.flags, t.env or {}) == (baseline.flags, baseline.env or {}))]


def _unsettled(study: StudyRecord, pool: Sequence[TrialRecord], noise: float) -> list[tuple[TrialRecord, str]]:
    """Trials whose first run does not settle where they stand: within `noise` of the best first run,
    then flagged ones; each group best first, with why."""
    name, direction = study.objectives[0]
    best = best_trial(study, pool)
    if best is None:
        return []
    top = float(best.objectives[name])
    ranked = sorted((t for t in pool if t is not best),
                    key=lambda t: -t.objectives[name] if direction == "maximize" else t.objectives[name])
    close, flagged = [], []
    for t in ranked:
        gap = abs(float(t.objectives[name]) / top - 1.0) if top else float("inf")
        if gap <= noise:
            close.append((t, f"first run within {gap:.1%} of the best (#{best.number}), inside the noise {noise:.1%}"))
        elif flags_of(t):
            flagged.append((t, f"flagged {', '.join(flags_of(t))}, first run {gap:.1%} from the best (#{best.number})"))
    return close + flagged


def pick_candidates(study: StudyRecord, trials: Sequence[TrialRecord], k: int, max_extra: int = 0,
                    rows: Sequence[ConfirmationRecord] = ()) -> Picks:
    """The non-baseline trials to repeat (see the module's docstring)."""
    baseline = next((t for t in trials if t.role == "baseline"), None)
    pool = _pool(trials)
    out: list[TrialRecord] = []

    def add(t: TrialRecord | None) -> None:
        if t is not None and t not in out and len(out) < k:
            out.append(t)

    best = best_trial(study, pool)
    add(best)
    add(best_trial(study, [t for t in pool if not quality_changing(study, t, baseline)]))
    costless = ""
    costs = first_run_costs(study, best, baseline) if best is not None else []
    if costs:
        free = best_trial(study, [t for t in pool if not first_run_costs(study, t, baseline)])
        if free is not None and free not in out and len(out) < k:
            costless = (f"#{free.number} is the best first run that costs nothing on the other objectives "
                        f"(the best, #{best.number}: {', '.join(costs)})")
        add(free)
    name, direction = study.objectives[0]
    for t in sorted(pareto_front(study, pool), key=lambda t: -t.objectives[name] if direction == "maximize"
                    else t.objectives[name]):
        add(t)
    noise, noise_why = noise_estimate(study, trials, rows)
    unsettled = [(t, why) for t, why in _unsettled(study, pool, noise) if t not in out]
    extras = [t for t, _ in unsettled[:max(max_extra, 0)]]
    left_out = [(t, why) for t, why in unsettled[max(max_extra, 0):]]
    repeated = {r.trial_id for r in rows}
    started = [t for t in pool if t.id in repeated and t not in out and t not in extras]
    return Picks(out + extras + started, extras, [(t, why) for t, why in left_out if t.id not in repeated],
                 noise, noise_why, costless)


def left_out(study: StudyRecord, trials: Sequence[TrialRecord], rows: Sequence[ConfirmationRecord],
             max_extra: int) -> tuple[list[tuple[TrialRecord, str]], str]:
    """For `show`, after a confirmation: the close or flagged trials that have no repeats (the budget
    `confirm.max_extra` went to others, or they were not close under the noise known when it picked), and
    the noise now known."""
    if not rows:
        return [], ""
    noise, noise_why = noise_estimate(study, trials, rows)
    repeated = {r.trial_id for r in rows}
    return [(t, why) for t, why in _unsettled(study, _pool(trials), noise) if t.id not in repeated], \
        f"noise {noise:.1%}: {noise_why}; confirm.max_extra = {max_extra}"
