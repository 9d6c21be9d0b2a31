"""What each knob did to each objective, from the trials that were measured (never a failed trial and
never the placeholder values Optuna was told for one): its importance (PED-ANOVA, report/importance.py)
beside a direction and a size a person can act on, and the number of trials each rests on.

- A knob with a few values (a switch, a choice, a handful of sizes): each value's median against the
  median of the value the baseline ran (vLLM's default) or, without one, the most common value.
- A knob with many values (a memory fraction, a token budget): the median of the trials above the knob's
  median value against those at or below it ("higher -> x1.12").

These are associations across the study's trials, not controlled comparisons: the sampler moved other
knobs at the same time. With fewer than MIN_GROUP trials on either side, or MIN_KNOB_TRIALS in all, a
knob's effect reads "too few trials" instead of a number. When two knobs split the trials into the very
same two sides (a dozen trials make that likely for switches), their figures are one figure counted twice:
each names the other, so that the user does not credit either. And when the two sides also differ
nearly throughout in another knob's value (SEPARATION: in 90 % of the cross-side pairs one side's value is
the higher), the effect names that knob and its medians on each side. On the H100 decode study, async
scheduling off read x0.431 capacity tok/s; its five off trials had max-num-seqs 16-174, three of its four
on trials 266-1,024, and the figure was mostly max-num-seqs again (benchmarks/gpu/knobs, session 26).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from autotune.report.importance import measured
from autotune.store.models import StudyRecord, TrialRecord

MIN_GROUP = 3          # trials on each side of a comparison
SEPARATION = 0.9       # share of cross-side pairs ordered one way for another knob to count as moving along
NAMED_ALONG = 2        # such knobs named in an effect's text (the JSON keeps them all)
MIN_KNOB_TRIALS = 6    # trials that set the knob at all
FEW_VALUES = 6         # a knob with at most this many distinct values is compared value by value
TOO_FEW = "too few trials"


@dataclass
class Group:
    label: str           # "64", "on", "> 256"
    n: int
    median: float
    trials: list[int] = field(default_factory=list)     # the trial numbers it holds


@dataclass
class Along:
    """Another knob whose values differ between an effect's two sides: its median on each."""

    knob: str
    best: str              # its median on the effect's best side ("0/6 on" for a switch)
    reference: str         # and on the reference side
    separation: float      # share of cross-side pairs ordered the majority way (0.5: none, 1: complete)

    def text(self) -> str:
        return f"{self.knob} {self.best} vs {self.reference}"


@dataclass
class KnobEffect:
    knob: str
    objective: str
    direction: str                        # maximize | minimize
    n: int                                # measured trials that set the knob
    importance: float | None = None       # PED-ANOVA, when computable
    reference: Group | None = None        # what the others are compared against
    groups: list[Group] = field(default_factory=list)
    best: Group | None = None             # the group with the largest gain for this objective
    ratio: float | None = None            # best.median / reference.median (None: too few trials)
    same_split: list[str] = field(default_factory=list)  # knobs whose two sides are these very trials
    moved_along: list[Along] = field(default_factory=list)  # other knobs that differ between the sides

    @property
    def too_few(self) -> bool:
        return self.ratio is None

    @property
    def helps(self) -> bool | None:
        if self.ratio is None:
            return None
        return self.ratio > 1.0 if self.direction == "maximize" else self.ratio < 1.0

    def text(self) -> str:
        """`higher -> x1.12 (better), 5 vs 6 trials` or `64 -> x0.91 (worse) vs 16, 4 vs 7 trials`."""
        if self.ratio is None or self.best is None or self.reference is None:
            return f"{TOO_FEW} ({self.n})"
        verdict = "better" if self.helps else ("same" if self.ratio == 1.0 else "worse")
        against = "" if self.best.label.startswith(">") else f" vs {self.reference.label}"
        what = "higher" if self.best.label.startswith(">") else self.best.label
        same = f"; the same trials as {', '.join(self.same_split)}: not told apart" if self.same_split else ""
        along = ""
        if self.moved_along:
            named = ", ".join(a.text() for a in self.moved_along[:NAMED_ALONG])
            more = len(self.moved_along) - NAMED_ALONG
            along = f"; {named}{f' and {more} more' if more > 0 else ''} moved with it: not told apart"
        return (f"{what} -> x{self.ratio:.3g} ({verdict}){against}, {self.best.n} vs {self.reference.n} trials"
                f"{same}{along}")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "too_few": self.too_few, "helps": self.helps, "text": self.text()}


def _label(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def knob_effects(study: StudyRecord, trials: Sequence[TrialRecord],
                 importances: Mapping[str, Mapping[str, float]] | None = None) -> list[KnobEffect]:
    """One KnobEffect per (knob, objective), knobs by importance on the first objective (then by size)."""
    rows = measured(trials)
    baseline = next((t for t in rows if t.role == "baseline"), None)
    knobs = list(dict.fromkeys(k for t in rows for k in (t.params or {})))
    out: list[KnobEffect] = []
    for knob in knobs:
        for name, direction in study.objectives:
            pairs = [(t.params[knob], float(t.objectives[name]), t.number) for t in rows
                     if knob in (t.params or {}) and name in (t.objectives or {})]
            if len({_label(v) for v, _, _ in pairs}) < 2:
                continue    # the knob never moved among measured trials: nothing to say
            imp = (importances or {}).get(name, {}).get(knob)
            effect = KnobEffect(knob, name, direction, len(pairs), imp)
            default = (baseline.params or {}).get(knob) if baseline is not None else None
            _fill(effect, pairs, default)
            out.append(effect)
    _mark_same_splits(out)
    _mark_moved_along(out, rows)
    first = study.objectives[0][0] if study.objectives else None
    rank = {e.knob: (e.importance if e.importance is not None else -1.0,
                     abs((e.ratio or 1.0) - 1.0)) for e in out if e.objective == first}
    return sorted(out, key=lambda e: tuple(-x for x in rank.get(e.knob, (-1.0, 0.0))))


def _group(label: str, members: list[tuple[float, int]]) -> Group:
    ys = [y for y, _ in members]
    return Group(label, len(ys), statistics.median(ys) if ys else float("nan"), sorted(n for _, n in members))


def _fill(effect: KnobEffect, pairs: list[tuple[Any, float, int]], default: Any) -> None:
    values = [v for v, _, _ in pairs]
    distinct = {_label(v) for v in values}
    if _numeric(values) and len(distinct) > FEW_VALUES:
        cut = statistics.median(float(v) for v in values)
        effect.reference = _group(f"<= {cut:g}", [(y, n) for v, y, n in pairs if float(v) <= cut])
        effect.groups = [_group(f"> {cut:g}", [(y, n) for v, y, n in pairs if float(v) > cut])]
    else:
        by: dict[str, list[tuple[float, int]]] = {}
        for v, y, n in pairs:
            by.setdefault(_label(v), []).append((y, n))
        ref = _label(default) if default is not None and _label(default) in by else max(by, key=lambda k: len(by[k]))
        effect.reference = _group(ref, by[ref])
        effect.groups = [_group(k, members) for k, members in by.items() if k != ref]
    ok = [g for g in effect.groups if g.n >= MIN_GROUP]
    if effect.n < MIN_KNOB_TRIALS or effect.reference.n < MIN_GROUP or not ok or not effect.reference.median:
        return
    sign = 1.0 if effect.direction == "maximize" else -1.0
    effect.best = max(ok, key=lambda g: sign * g.median)
    effect.ratio = effect.best.median / effect.reference.median


def _mark_same_splits(effects: Sequence[KnobEffect]) -> None:
    """Knobs (per objective) whose compared sides hold the same trials, either way round."""
    by: dict[tuple[str, frozenset[frozenset[int]]], list[KnobEffect]] = {}
    for e in effects:
        if e.best is not None and e.reference is not None:
            sides = frozenset({frozenset(e.best.trials), frozenset(e.reference.trials)})
            by.setdefault((e.objective, sides), []).append(e)
    for group in by.values():
        for e in group:
            e.same_split = [o.knob for o in group if o is not e]


def _summary(values: Sequence[Any]) -> str:
    """A side's values of a knob that moved along: `0/6 on` for a switch, else the median."""
    if all(isinstance(v, bool) for v in values):
        return f"{sum(values)}/{len(values)} on"
    m = statistics.median(float(v) for v in values)
    return f"{int(m)}" if m.is_integer() else f"{m:.3g}"


def _separation(a: Sequence[float], b: Sequence[float]) -> float:
    """The share of (a, b) pairs with a > b, ties counted half (the Mann-Whitney U over the pair count)."""
    wins = sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)
    return wins / (len(a) * len(b))


def _mark_moved_along(effects: Sequence[KnobEffect], rows: Sequence[TrialRecord]) -> None:
    """For each effect with a figure, the numeric (or on/off) knobs other than itself whose values on its
    two sides are ordered one way in at least SEPARATION of the cross-side pairs, most separated first.
    Knobs already named as the same split are left out."""
    params = {t.number: t.params or {} for t in rows}
    for e in effects:
        if e.best is None or e.reference is None:
            continue
        found = []
        for other in dict.fromkeys(k for p in params.values() for k in p):
            if other == e.knob or other in e.same_split:
                continue
            a = [params[n][other] for n in e.best.trials if _number_like(params[n].get(other))]
            b = [params[n][other] for n in e.reference.trials if _number_like(params[n].get(other))]
            if len(a) < MIN_GROUP or len(b) < MIN_GROUP:
                continue
            sep = _separation([float(x) for x in a], [float(x) for x in b])
            sep = max(sep, 1.0 - sep)
            if sep >= SEPARATION:
                found.append(Along(other, _summary(a), _summary(b), round(sep, 3)))
        e.moved_along = sorted(found, key=lambda x: -x.separation)


def _number_like(v: Any) -> bool:
    return isinstance(v, (int, float))       # bool included: on/off as 1/0


def effect_rows(effects: Sequence[KnobEffect], objectives: Sequence[str]) -> list[list[str]]:
    """[knob, trials, then per objective: importance and effect], for `show` and the report."""
    by = {(e.knob, e.objective): e for e in effects}
    rows = []
    for knob in dict.fromkeys(e.knob for e in effects):
        n = max(e.n for e in effects if e.knob == knob)
        cells = [knob, str(n)]
        for name in objectives:
            e = by.get((knob, name))
            if e is None:
                cells += ["-", "-"]
                continue
            cells += ["-" if e.importance is None else f"{e.importance:.2f}", e.text()]
        rows.append(cells)
    return rows


NOTE = ("knob effects over measured trials only (failed trials and their placeholder values left out): "
        "importance = PED-ANOVA share; effect = median of the trials at the best-doing value (or above the "
        "knob's median) against those at the baseline's value (or at or below it), as a ratio. An "
        f"association, not a controlled test: other knobs moved too. Fewer than {MIN_GROUP} trials on a side "
        f"or {MIN_KNOB_TRIALS} in all: '{TOO_FEW}'. Knobs whose two sides are the same trials are named "
        "together: one association, not two; so are knobs whose values differ between the two sides in "
        f"{SEPARATION:.0%} of the cross-side pairs ('moved with it', their medians on each side).")
