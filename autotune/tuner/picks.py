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

The noise is the larger of twice the median repeat spread on the first objective (over the
configurations repeated twice or more: `noise_estimate`) and NOISE_FLOOR (5 %). When a study's
confirmation first picks, no repeats exist yet, so the floor is the noise; a continued or later
confirmation (`autotune confirm`, the same `run` again) uses the spreads its stored repeats measured,
which can only widen the circle. A trial that already has repeats stays in the plan whatever the picks
say now, so a confirmation that was cut short is always finished with the configurations it started,
and one that joins later is repeated beside the baseline without voiding the rounds the others finished
(tuner/confirm.py `rounds_to_run`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.store.queries import best_trial, is_feasible, pareto_front
from autotune.tuner.verdict import (NOISE_FLOOR, first_key, first_run_costs, flags_of, quality_changing,
                                    relative_spread)


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
    """The relative noise of one first run on the first objective, and where the figure comes from: twice
    the median of the repeat spreads of every configuration with two or more, not the baseline's alone.
    One configuration can sit on a knife-edge of the SLO: on the H100 decode study the defaults' p99 TPOT
    lay near its 20 ms limit and their repeats landed at 14,847 and 10,954 tok/s (30.2 %), while the
    three candidates' spread 1.8, 1.9 and 17.4 %; twice the baseline's 30.2 % called a trial 31 % behind
    the best "within the noise" and sent it to the confirmation."""
    name = study.objectives[0][0]
    by_trial: dict[int, list[float]] = {}
    for r in rows:
        if r.state == "ok" and (r.objectives or {}).get(name) is not None:
            by_trial.setdefault(r.trial_id, []).append(float(r.objectives[name]))
    spreads = [relative_spread(v) for v in by_trial.values() if len(v) >= 2]
    if not spreads:
        return NOISE_FLOOR, f"the {NOISE_FLOOR:.0%} floor (no configuration repeated twice yet)"
    mid = statistics.median(spreads)
    base = next((t for t in trials if t.role == "baseline"), None)
    own = by_trial.get(base.id, []) if base is not None else []
    of = (f"the median repeat spread of {len(spreads)} configurations ({mid:.1%}; the baseline's "
          f"{relative_spread(own):.1%})" if len(spreads) > 1 and len(own) >= 2
          else f"the median repeat spread of {len(spreads)} configuration(s) ({mid:.1%})")
    if 2 * mid > NOISE_FLOOR:
        return 2 * mid, f"twice {of}"
    return NOISE_FLOOR, f"the {NOISE_FLOOR:.0%} floor (twice {of} is {2 * mid:.1%})"


def _pool(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    baseline = next((t for t in trials if t.role == "baseline"), None)
    return [t for t in trials if t.role != "baseline" and is_feasible(t)
            and not (baseline is not None and (t.flags, t.env or {}) == (baseline.flags, baseline.env or {}))]


def _unsettled(study: StudyRecord, pool: Sequence[TrialRecord], noise: float) -> list[tuple[TrialRecord, str]]:
    """Trials whose first run does not settle where they stand: within `noise` of the best first run,
    then flagged ones; each group best first, with why."""
    name = study.objectives[0][0]
    best = best_trial(study, pool)
    if best is None:
        return []
    top = float(best.objectives[name])
    ranked = sorted((t for t in pool if t is not best), key=lambda t: first_key(study, t.objectives))
    close, flagged = [], []
    for t in ranked:
        gap = abs(float(t.objectives[name]) / top - 1.0) if top else float("inf")
        if gap <= noise:
            close.append((t, f"first run within {gap:.1%} of the best (#{best.number}), inside the noise {noise:.1%}"))
        elif flags_of(t):
            flagged.append((t, f"flagged {', '.join(flags_of(t))}, first run {gap:.1%} from the best (#{best.number})"))
    return close + flagged


def pick_candidates(study: StudyRecord, trials: Sequence[TrialRecord], k: int, max_extra: int = 0,
                    rows: Sequence[ConfirmationRecord] = (), every: bool = False) -> Picks:
    """The non-baseline trials to repeat (see the module's docstring); with `every`, all of them, best
    first: an ablation (tuner/ablation.py) asks what each of its variants does, and a dominated one answers
    that its knob alone does not carry the gain."""
    baseline = next((t for t in trials if t.role == "baseline"), None)
    pool = _pool(trials)
    if every:
        return Picks(sorted(pool, key=lambda t: first_key(study, t.objectives)), [], [])
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
    for t in sorted(pareto_front(study, pool), key=lambda t: first_key(study, t.objectives)):
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
