"""The verdict against the defaults, from confirmation rounds (tuner/confirm.py): which configurations
stay on the front and how each compares with the baseline. What gets exported from that is
tuner/winner.py's choice.

The unit of evidence is one paired round: the baseline (A) and a candidate (B) measured on fresh servers
with the same prompt seed, next to each other in time. Per round the ratio B / A cancels what the round
shares (the machine's speed that hour, the prompts drawn); the interval is a Student t interval on the
mean of the rounds' log ratios, turned back into a ratio (a geometric mean with its 95 % interval). Why t
on logs and not a bootstrap: with the 3 to 5 rounds a study can afford, a bootstrap over 3 values has 10
distinct resamples and its percentile interval is far too narrow, while t with n - 1 degrees of freedom
widens honestly (t = 4.30 at 3 rounds); logs make a 10 % gain and a 10 % loss symmetric and keep the
interval of a ratio positive.

"No gain beyond noise" is said when the interval includes 1, or when the gain is smaller than the spread
between repeats of one configuration (the larger of the two sides'): a difference smaller than what the
same config does from one server start to the next is not a finding. Which spread is a study's own rule
(`spread_rule`), fixed when its first confirmation round is stored:
- "gap", the median of the absolute gaps between every two repeats, over their median: the typical
  distance between two restarts of the same settings. It does not grow with the number of repeats.
- "range", (max - min) / median: the rule of the studies confirmed before "gap" existed. It grows with
  every repeat added, so a study that ran more rounds to settle a leaning verdict raised its own bar
  (the H100 decode study: the defaults' range 27.8 % over 4 repeats, their median gap 13.9 %).
A study keeps the rule it was stamped with, so no verdict changes after its numbers are seen.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.store.queries import _dominates
from autotune.telemetry.summary import summary_from_store

MIN_ROUNDS = 3
# two-sided 95 % Student t quantiles, degrees of freedom 1..30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """Two-sided 95 % t quantile (Cornish-Fisher beyond the table, within 0.1 % there)."""
    if df < 1:
        raise ValueError("a t interval needs at least 2 rounds")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass
class RatioInterval:
    ratio: float        # geometric mean of the per-round ratios B / A
    low: float
    high: float
    rounds: int
    each: tuple[float, float] = (1.0, 1.0)     # the lowest and highest per-round ratio

    def includes_one(self) -> bool:
        return self.low <= 1.0 <= self.high

    def one_sided(self) -> bool:
        """Every round's ratio on the same side of 1 (the interval may still include it)."""
        return self.each[0] > 1.0 or self.each[1] < 1.0


def paired_ratio_interval(ratios: Sequence[float]) -> RatioInterval:
    """95 % t interval over the per-round ratios, on the log scale (see the module's docstring)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    if n < 2 or any(not math.isfinite(x) for x in logs):
        raise ValueError("need at least 2 finite positive ratios")
    mean = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, (min(ratios), max(ratios)))


# rule -> (its name beside a spread, what it measures in words)
SPREAD_RULES = {"gap": ("median gap", "the median gap between two of its repeats"),
                "range": ("range", "the range of its repeats")}
SPREAD_RULE = "gap"         # what a study's first stored confirmation round stamps (store/repository.py)
OLD_SPREAD_RULE = "range"   # a study with rounds stored before the stamp existed


def relative_spread(values: Sequence[float], rule: str = OLD_SPREAD_RULE) -> float:
    """How far apart one configuration's repeats land, relative to their median, by `rule` (the module's
    docstring): "range" (max - min) or "gap" (the median absolute difference of every two repeats)."""
    if rule not in SPREAD_RULES:
        raise ValueError(f"unknown spread rule {rule!r}")
    med = statistics.median(values)
    if not med:
        return math.inf
    if rule == "range":
        return (max(values) - min(values)) / abs(med)
    gaps = [abs(a - b) for i, a in enumerate(values) for b in values[i + 1:]]
    return statistics.median(gaps) / abs(med)


def spread_rule(study: StudyRecord) -> str:
    """The study's stamped rule; unstamped means its rounds (if any) were stored under the range."""
    return study.spread_rule or OLD_SPREAD_RULE


@dataclass
class ObjectiveVerdict:
    objective: str
    direction: str
    interval: RatioInterval | None
    spread: float | None        # the larger of the two sides' relative spreads
    beyond_noise: bool
    rule: str = OLD_SPREAD_RULE     # how `spread` was measured

    @property
    def better(self) -> bool:
        """Beyond noise and in the objective's good direction."""
        return self.beyond_noise and self.interval is not None and \
            (self.interval.ratio > 1) == (self.direction == "maximize")

    @property
    def worse(self) -> bool:
        """Beyond noise and in the objective's bad direction: what keeps a candidate from the export."""
        return self.beyond_noise and not self.better

    def text(self) -> str:
        if self.interval is None:
            return f"{self.objective}: too few paired rounds for an interval"
        iv = self.interval
        word = ("better" if self.better else "worse") if self.beyond_noise else "no gain beyond noise"
        spread = f", spread {self.spread:.1%} ({SPREAD_RULES[self.rule][0]})" if self.spread is not None else ""
        why = []
        if self.leaning():
            why.append(f"every round {'above' if iv.each[0] > 1 else 'below'} 1: x{iv.each[0]:.3f}-x{iv.each[1]:.3f}")
        if self.held_by_spread():
            why.append(("the interval clears 1, but " if not iv.includes_one() else "")
                       + f"the difference {abs(iv.ratio - 1.0):.1%} is below the spread {self.spread:.1%} of one "
                         "configuration's repeats")
        return (f"{self.objective} x{iv.ratio:.3f} [{iv.low:.3f}, {iv.high:.3f}] over {iv.rounds} paired "
                f"rounds{spread}: {word}" + (f" ({'; '.join(why)})" if why else ""))

    def held_by_spread(self) -> bool:
        """The evidence leans one way (the interval excludes 1, or every round is on one side) and the spread
        rule keeps the gain from being claimed. Said apart from an interval that merely includes 1, because
        more rounds may not help here: under the range rule the spread never narrows as repeats are added
        (the H100 decode study after 4 paired rounds: x1.269 [1.000, 1.610], the defaults' repeats spread
        27.8 %, one of them at 10,954 tok/s against 14,847-15,085 for the other three)."""
        iv = self.interval
        return (not self.beyond_noise and iv is not None and self.spread is not None
                and abs(iv.ratio - 1.0) < self.spread and (not iv.includes_one() or iv.one_sided()))

    def more_rounds_can_settle(self) -> bool:
        """Leaning in every round with a gain already at or above the spread: only the interval is short."""
        return self.leaning() and not self.held_by_spread()

    def leaning(self) -> bool:
        """Every paired round on one side of 1 while the interval still includes it: more rounds can settle
        it where the difference is at or above the spread (the H100 decode study's defaults spread 26-30 %
        on a knife-edge of the TPOT bound, against candidates at 2 %). Not a verdict: nothing is claimed
        until the interval excludes 1."""
        iv = self.interval
        return not self.beyond_noise and iv is not None and iv.includes_one() and iv.one_sided()


def objective_verdict(objective: str, direction: str, pairs: Sequence[tuple[float, float]],
                      base_repeats: Sequence[float], cand_repeats: Sequence[float],
                      rule: str = OLD_SPREAD_RULE) -> ObjectiveVerdict:
    """`pairs` are (baseline, candidate) values of the same rounds; `rule` is the study's (spread_rule)."""
    usable = [(a, b) for a, b in pairs if a > 0 and b > 0]
    spreads = [relative_spread(v, rule) for v in (base_repeats, cand_repeats) if len(v) >= 2]
    spread = max(spreads) if spreads else None
    if len(usable) < MIN_ROUNDS:
        return ObjectiveVerdict(objective, direction, None, spread, False, rule)
    iv = paired_ratio_interval([b / a for a, b in usable])
    gain = abs(iv.ratio - 1.0)
    beyond = not iv.includes_one() and (spread is None or gain >= spread)
    return ObjectiveVerdict(objective, direction, iv, spread, beyond, rule)


# -- a study's confirmations --------------------------------------------------------------------------
# The measurement noise assumed where none is measured: a first run further than this (or than its
# repeats' own spread, when larger) from its confirmed median was not reproduced; at pick time (the
# baseline's repeats do not exist yet) a first run within it of the best is "close" (tuner/picks.py).
NOISE_FLOOR = 0.05


@dataclass
class Confirmed:
    """One configuration's repeats: medians, spreads, whether it stays on the front, and why not."""

    trial: TrialRecord
    rows: list[ConfirmationRecord]
    medians: dict[str, float] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)
    survives: bool = False
    pending: bool = False            # fewer repeats than a verdict needs, none failed: not finished yet
    why_not: str = ""
    verdicts: list[ObjectiveVerdict] = field(default_factory=list)   # against the baseline
    quality: dict[str, Any] = field(default_factory=dict)            # quality knobs it changes -> its value

    @property
    def quality_changing(self) -> bool:
        return bool(self.quality)

    def least_headroom(self) -> tuple[float, str, int] | None:
        """The least free memory fraction any of its runs left at peak, which run that was ("first
        run", "round-N repeat"), and how many runs measured memory; None when none did. The
        worst run, not the median: an out-of-memory error in a deploy needs one bad moment. Repeats
        stored before they carried telemetry leave only the first run."""
        runs = [("first run", self.trial.telemetry)]
        runs += [(f"round-{r.round + 1} repeat", r.telemetry) for r in self.rows if r.state != "failed"]
        free = [(h, which) for which, tel in runs if tel and (h := summary_from_store(tel).mem_headroom) is not None]
        if not free:
            return None
        h, which = min(free, key=lambda x: x[0])
        return h, which, len(free)

    def first_run(self, name: str) -> float | None:
        """The first run's value of objective `name` (what Optuna was told)."""
        v = (self.trial.objectives or {}).get(name)
        return float(v) if v is not None else None

    def reproduced(self, name: str) -> bool | None:
        """Whether the repeats reproduce the first run on `name`: its first run lies within the larger of
        the repeats' spread and NOISE_FLOOR of their median. None when either is missing."""
        first, med = self.first_run(name), self.medians.get(name)
        if first is None or not med:
            return None
        return abs(first / med - 1.0) <= max(self.spreads.get(name, 0.0), NOISE_FLOOR)

    def loads(self) -> list[float | None]:
        """The load at which each repeat still met the SLO (its capacity), in round order: information
        beside the objectives, never the criterion (past the knee it moves with noise, the tokens/s do not)."""
        return [(r.capacity or {}).get("capacity") for r in self.rows if r.state != "failed"]

    def verdict(self, name: str) -> ObjectiveVerdict | None:
        return next((v for v in self.verdicts if v.objective == name), None)

    def to_json(self) -> dict[str, Any]:
        first, least = {n: self.first_run(n) for n in self.medians}, self.least_headroom()
        return {"trial": self.trial.number, "repeats": len(self.rows), "medians": self.medians,
                "spreads": self.spreads, "first_run": first,
                "reproduced": {n: self.reproduced(n) for n in self.medians},
                "first_run_bracket": list(first_bracket(self.trial) or ()) or None, "loads": self.loads(),
                "survives": self.survives, "why_not": self.why_not or None,
                "quality_changing": self.quality_changing, "quality": self.quality,
                "least_headroom": dict(zip(("free", "run", "runs"), least)) if least else None,
                "verdict": [{"objective": v.objective, "ratio": v.interval.ratio if v.interval else None,
                             "low": v.interval.low if v.interval else None,
                             "high": v.interval.high if v.interval else None,
                             "rounds": v.interval.rounds if v.interval else 0, "spread": v.spread,
                             "spread_rule": v.rule,
                             "beyond_noise": v.beyond_noise, "worse": v.worse, "text": v.text()}
                            for v in self.verdicts]}


def quality_changes(study: StudyRecord, trial: TrialRecord, baseline: TrialRecord | None) -> dict[str, Any]:
    """The quality knobs (FP8 weights, KV-cache dtype: those the study opted into) that `trial` sets to
    other than what the baseline ran, with their values. The baseline records vLLM's defaults for them
    (quantization none, kv_cache_dtype auto), so a knob merely present is not a change."""
    ref = (baseline.params or {}) if baseline is not None else {}
    params = trial.params or {}
    return {k: params[k] for k in (study.quality_knobs or []) if k in params and params[k] != ref.get(k)}


def quality_changing(study: StudyRecord, trial: TrialRecord, baseline: TrialRecord | None) -> bool:
    """A trial changes output quality when it sets a quality knob to other than what the baseline ran."""
    return bool(quality_changes(study, trial, baseline))


def bracket_low(trial: TrialRecord) -> float | None:
    """The lower end of the first run's capacity bracket (the highest load it met)."""
    first = first_bracket(trial)
    return first[0] if first is not None else (trial.capacity or {}).get("capacity")


def first_bracket(trial: TrialRecord) -> tuple[float, float | None] | None:
    """The first run's capacity bracket (highest met, lowest broken load): where a repeat's capacity
    search starts (bench/capacity.py `hint`), since a repeat asks whether that load is met again."""
    br = (trial.capacity or {}).get("bracket")
    if not br or br[0] is None:
        return None
    return float(br[0]), (float(br[1]) if br[1] is not None else None)


def _unmet(row: ConfirmationRecord) -> str:
    """Why a repeat that ran is not a measurement meeting the study's bar, in words."""
    broken = [k for k, v in (row.constraints or {}).items() if v > 0]
    if not broken or any(k.startswith("slo:") for k in broken) or not row.objectives:
        return f"repeat {row.round + 1} broke the SLO at every load"
    return f"repeat {row.round + 1} broke {', '.join(sorted(broken))}"


def summarize_confirmations(study: StudyRecord, trials: Sequence[TrialRecord],
                            rows: Sequence[ConfirmationRecord]) -> dict[int, Confirmed]:
    """Trial number -> its confirmation, for every trial with repeats.

    Survival is judged by what the study optimizes: a configuration leaves the front only when a repeat
    fails to start or crashes, or breaks the SLO at every load (then it has no value to rank). A first
    run its repeats do not reproduce stays, ranked by its confirmed median (`Confirmed.reproduced` says
    so); the load at which the SLO held is reported beside it and decides nothing: past the knee of the
    throughput curve that load moves with noise between fresh servers while the tokens/s do not (the
    H200 FP8 study: SLO met at 149 streams in the first run, 129 / 157 / 129 in repeats at the same
    ~6,960 tok/s)."""
    by_id = {t.id: t for t in trials}
    grouped: dict[int, list[ConfirmationRecord]] = {}
    for r in rows:
        if r.trial_id in by_id:
            grouped.setdefault(r.trial_id, []).append(r)
    names = [(o, d) for o, d in study.objectives]
    rule = spread_rule(study)
    baseline = next((t for t in trials if t.role == "baseline"), None)
    # the rounds a candidate can pair with: a round cut in an earlier run may hold it without the baseline
    base_round_set = {r.round for r in grouped.get(baseline.id, [])} if baseline is not None else set()
    out: dict[int, Confirmed] = {}
    for tid, reps in grouped.items():
        t = by_id[tid]
        c = Confirmed(t, sorted(reps, key=lambda r: r.round), quality=quality_changes(study, t, baseline))
        ok = [r for r in c.rows if r.state == "ok" and r.objectives]
        for name, _ in names:
            vals = [r.objectives[name] for r in ok if r.objectives.get(name) is not None]
            if vals:
                c.medians[name] = statistics.median(vals)
                c.spreads[name] = relative_spread(vals, rule) if len(vals) >= 2 else 0.0
        failed = [r for r in c.rows if r.state == "failed"]
        unmet = [r for r in c.rows if r.state != "failed" and r not in ok]
        if failed:
            c.why_not = f"repeat {failed[0].round + 1} failed ({failed[0].cause})"
        elif unmet:
            c.why_not = _unmet(unmet[0])
        elif len(c.rows) < MIN_ROUNDS:
            c.pending, c.why_not = True, f"{len(c.rows)} of {MIN_ROUNDS} repeats so far"
        elif t is not baseline and base_round_set \
                and len(shared := base_round_set & {r.round for r in c.rows}) < MIN_ROUNDS:
            c.pending, c.why_not = True, f"{len(shared)} of {MIN_ROUNDS} rounds paired with the baseline so far"
        elif any(n not in c.medians for n, _ in names):
            c.why_not = "its repeats did not measure " + ", ".join(n for n, _ in names if n not in c.medians)
        else:
            c.survives = True
        out[t.number] = c
    base = out.get(baseline.number) if baseline is not None else None
    if base is not None:
        base_rounds = {r.round: r for r in base.rows if r.state == "ok"}
        for c in out.values():
            if c is base:
                continue
            for name, direction in names:
                pairs = [(base_rounds[r.round].objectives[name], r.objectives[name]) for r in c.rows
                         if r.state == "ok" and r.round in base_rounds and name in r.objectives
                         and name in base_rounds[r.round].objectives]
                c.verdicts.append(objective_verdict(
                    name, direction, pairs, [r.objectives[name] for r in base_rounds.values() if name in r.objectives],
                    [r.objectives[name] for r in c.rows if r.state == "ok" and name in r.objectives], rule))
    return out


def confirmed_front(study: StudyRecord, confirmed: dict[int, Confirmed]) -> list[Confirmed]:
    """The Pareto front over the confirmed medians of the configurations that survived confirmation."""
    names = [o for o, _ in study.objectives]
    maximize = [d == "maximize" for _, d in study.objectives]
    alive = [c for c in confirmed.values() if c.survives]
    vec = {c.trial.number: [c.medians[n] for n in names] for c in alive}
    front = [c for c in alive if not any(_dominates(vec[o.trial.number], vec[c.trial.number], maximize)
                                         for o in alive if o is not c)]
    return sorted(front, key=lambda c: first_key(study, c.medians))


def first_run_costs(study: StudyRecord, trial: TrialRecord, baseline: TrialRecord | None) -> list[str]:
    """The objectives after the first on which `trial`'s first run is worse than the baseline's by more
    than NOISE_FLOOR, each as "name value against the baseline's value (x ratio)"; empty without a
    measured baseline. A winner on the first objective may pay on the others (the H200 chat study's best
    first run: x1.26 capacity at x5.6 p50 TPOT under a TTFT-only SLO): the export says so, and the
    confirmation also repeats the best first run that pays nothing (tuner/picks.py)."""
    if baseline is None or baseline is trial:
        return []
    out = []
    for name, direction in study.objectives[1:]:
        a, b = baseline.objectives.get(name), trial.objectives.get(name)
        if not a or not b or a <= 0 or b <= 0:
            continue
        ratio = b / a
        if worse_beyond_floor(ratio, direction):
            out.append(f"{name} {b:.4g} against the baseline's {a:.4g} (x{ratio:.3g})")
    return out


def worse_beyond_floor(ratio: float, direction: str) -> bool:
    """`ratio` (one value over a reference) is worse than the reference by more than NOISE_FLOOR."""
    return ratio < 1 - NOISE_FLOOR if direction == "maximize" else ratio > 1 + NOISE_FLOOR


def first_key(study: StudyRecord, values: dict[str, float]) -> float:
    """Sort key: better on the study's first objective sorts first."""
    name, direction = study.objectives[0]
    return -values[name] if direction == "maximize" else values[name]


def flags_of(trial: TrialRecord) -> list[str]:
    """The trial's measurement flags; for a trial stored before the column existed (NULL), read back from
    the evidence it did store: its cause and its capacity search's note."""
    if trial.measurement_flags is not None:
        return list(trial.measurement_flags)
    note = (trial.capacity or {}).get("note") or ""
    out = []
    if trial.cause == "client_saturated" or "client saturated" in note:
        out.append("client_saturated")
    if "prefix cache served random prompts" in note:
        out.append("prefix_hits")
    return out
