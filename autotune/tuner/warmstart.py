"""Warm start from the twin: before the first launch, the simulator ranks a few hundred candidates of
the space and the best few are enqueued right after the baseline, so the GPU's first minutes go to
configurations the physics already favours instead of the sampler's random start-up draws.

It applies where the twin can say something: the model has a built-in profile or a `config.json`, and
the GPU is in the catalog (`autotune/perfmodel`). The twin is optimistic near a TTFT SLO and wrong on
MoE by a third (benchmarks/sim_calibration.md), so it only chooses what runs first; every pick is
measured like any other trial, and its prediction is kept beside the measurement (`show`).

    picks, ranking = warm_start_picks(space, fixed, num_gpus, predict, objective="capacity_tps",
                                      maximize=True, n=200, k=3, seed=0)
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from autotune.space import SearchSpace
from autotune.space.space import without_orphans
from autotune.tuner.dedupe import draw, draw_value, flags_key

Predictor = Callable[[Mapping[str, Any]], "dict[str, float] | None"]   # params -> predicted objectives
# Predictions this close are one value to the twin (its measured errors are 20-40 %, and several knobs
# change nothing in it, e.g. a max-num-seqs above the concurrency its SLO allows): the picks are spread
# over such a tie instead of being three near-copies of one configuration.
TIE = 0.02


@dataclass
class Pick:
    params: dict[str, Any]
    rank: int                       # 1 = the twin's best of the candidates it ranked
    predicted: dict[str, float]
    sampled: list[str] = field(default_factory=list)   # knobs the twin does not model: drawn for the pick (complete_pick)


@dataclass
class Ranking:
    """The twin's predicted values of the ranked candidates, best first: where a new candidate would
    stand among them (`rank_of`), so every trial can carry the twin's rank beside its measurement."""

    objective: str
    maximize: bool
    values: list[float] = field(default_factory=list)

    def rank_of(self, value: float) -> int:
        keys = sorted(-v if self.maximize else v for v in self.values)
        return bisect.bisect_left(keys, -value if self.maximize else value) + 1


def warm_start_picks(space: SearchSpace, fixed_flags: Sequence[str], num_gpus: int, predict: Predictor, *,
                     objective: str, maximize: bool, n: int = 200, k: int = 3,
                     seed: int = 0) -> tuple[list[Pick], Ranking]:
    """Rank `n` distinct random candidates (inside the known constraints) by the twin's `objective`
    and return `k` picks with distinct flags: the best, spread over the candidates that tie with it
    (`_spread`). Candidates the twin says cannot start are dropped."""
    space, unmodelled = modelled_subspace(space)
    cands = draw_candidates(space, fixed_flags, num_gpus, n, seed)
    return rank(space, [(c, predict(c)) for c in cands], objective=objective, maximize=maximize, k=k,
                sampled=unmodelled)


def draw_candidates(space: SearchSpace, fixed_flags: Sequence[str], num_gpus: int, n: int,
                    seed: int) -> list[dict[str, Any]]:
    """`n` distinct random candidates inside the known constraints (fewer where the space holds fewer),
    in the order drawn: the same list for the same space and seed, so a cached ranking serves again."""
    rng = random.Random(seed)
    order = space._ordered()
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(n * 5):
        if len(seen) >= n:
            break
        cand = draw(space.params, order, rng)
        key = flags_key(space.render(cand))
        if key in seen or space.violations(cand, fixed_flags, num_gpus):
            continue
        seen.add(key)
        out.append(cand)
    return out


def rank(space: SearchSpace, predicted: Sequence[tuple[dict[str, Any], "dict[str, float] | None"]], *,
         objective: str, maximize: bool, k: int, sampled: Sequence[str] = ()) -> tuple[list[Pick], Ranking]:
    """The picks and the ranking from the twin's predictions of candidates (None: it cannot start), all
    of them or as many as were ranked by a deadline. `sampled`: the knobs the twin does not model (the
    pick draws them: complete_pick)."""
    scored = [(float(pred[objective]), cand, pred) for cand, pred in predicted
              if pred is not None and pred.get(objective) is not None]
    scored.sort(key=lambda s: -s[0] if maximize else s[0])
    ranking = Ranking(objective, maximize, [s[0] for s in scored])
    return [Pick(scored[i][1], i + 1, scored[i][2], list(sampled)) for i in _spread(space, scored, k, maximize)], ranking


def complete_pick(space: SearchSpace, pick: Pick, fixed_flags: Sequence[str], num_gpus: int, seed: str,
                  slot: int = 0, tries: int = 200) -> dict[str, Any] | None:
    """The pick's params with the knobs the twin does not model filled in, inside the whole space's rules;
    None when no fill of `tries` keeps them. `seed` is the study's (its name and seed), `slot` the pick's
    place among the study's picks (0 first): the same pick of the same study gets the same fill.

    The first fill spreads each categorical knob over the picks: pick `slot` takes the choice `slot`
    places after an offset drawn for the study and the knob, so k picks try k different values (as many
    as the knob has), and other studies start elsewhere. Independent draws per pick, seeded by the
    pick's rank, gave the top pick of every study with seed 0 one and the same fill: both H200 studies
    of issue 24 spent their twin's #1 trial on TRITON_ATTN, stream interval 2 and block size 16. Numeric
    knobs, and the fills after a first that breaks a rule, are drawn.

    Why not leave those knobs to the sampler: the ranking checked the rules on the knobs it ranked only,
    and a rule that joins one of each (with chunked MM input off, a token budget below the largest image)
    then rejected 3 of 6 picks of an H200 study before launch (issue 25). A parent of a ranked knob keeps
    a value under which that knob is active."""
    rng = random.Random(f"{seed}:{slot}")
    order = [p for p in space._ordered() if p.name in pick.sampled]
    ranked = [space.params[n] for n in pick.params if n in space.params]
    for attempt in range(tries):
        cand = dict(pick.params)
        for p in order:
            if not space._active(p, cand):
                continue
            needed = [c.when[p.name] for c in ranked if p.name in c.when]
            choices = [v for v in p.choices if all(v in n for n in needed)] if p.kind in ("bool", "categorical") else []
            if choices and attempt == 0:
                offset = random.Random(f"{seed}:{p.name}").randrange(len(p.choices))
                cand[p.name] = choices[(offset + slot) % len(choices)]
            else:
                cand[p.name] = rng.choice(choices) if choices else draw_value(p, rng)
        if all(space._active(c, cand) for c in ranked) and not space.violations(cand, fixed_flags, num_gpus):
            return cand
    return None


def modelled_subspace(space: SearchSpace) -> tuple[SearchSpace, list[str]]:
    """The knobs the twin models (perfmodel/knobs.py), and the names of the others. The twin predicts the
    same for every value of a knob it does not model: ranking over one would read "no effect" where
    nothing is known, so the ranking leaves such knobs to the sampler (the twin ranks at their defaults;
    a knob conditional on one is ranked only where that default activates it)."""
    from autotune.perfmodel.knobs import modelled

    keep = without_orphans({n: p for n, p in space.params.items() if modelled(p.knobs())}, space.params)
    sub = SearchSpace(keep, list(space.fixed_flags), space.source, space.model_max_len, multimodal=space.multimodal)
    return sub, [n for n in space.params if n not in keep]


def _spread(space: SearchSpace, scored: Sequence[tuple[float, dict[str, Any], Any]], k: int,
            maximize: bool) -> list[int]:
    """Indices (into `scored`, best first) of the picks: the best; then, while candidates tie with it
    (within TIE: a prefix of `scored`), the tied one farthest from the picks so far (ties of distance to
    the better prediction); then the best of the rest, in order."""
    if not scored:
        return []
    top = scored[0][0]
    bound = top - abs(top) * TIE if maximize else top + abs(top) * TIE
    tied = sum(1 for v, _, _ in scored if (v >= bound if maximize else v <= bound))
    picks = [0]
    for _ in range(min(k, tied) - 1):
        left = [i for i in range(tied) if i not in picks]
        picks.append(max(left, key=lambda i: (min(_distance(space, scored[i][1], scored[j][1]) for j in picks), -i)))
    return picks + [i for i in range(tied, len(scored))][: k - len(picks)]


def _distance(space: SearchSpace, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far apart two candidates are: per parameter, the share of its range between them (on the log
    scale where the range is searched on it), or 1 for a different choice."""
    d = 0.0
    for name, spec in space.params.items():
        x, y = a.get(name), b.get(name)
        if x == y:
            continue
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        if numeric and spec.low is not None and spec.high is not None and spec.high > spec.low:
            f = math.log if spec.log else float
            d += abs(f(x) - f(y)) / (f(spec.high) - f(spec.low))
        else:
            d += 1.0
    return d


def twin_predictor(model: str, gpu: str | None, num_gpus: int, fixed_flags: Sequence[str], space: SearchSpace,
                   workload: Mapping[str, Any], slo: Any, requests: int = 96) -> Predictor | None:
    """The in-process twin as a predictor of one candidate's capacity, or None where it does not apply
    (unknown model or GPU, or a workload without fixed lengths)."""
    from autotune.errors import UserError
    from autotune.pdlayout import split_pd_flags
    from autotune.perfmodel import find_gpu, find_profile, plan
    from autotune.bench.workloads import parse_workload
    from autotune.sim.capacity import at_capacity, capacity_curve
    from autotune.sim.inprocess import ImageMix

    if find_gpu(gpu) is None or find_profile(model) is None or workload.get("kind") not in ("random", "prefix", "image"):
        return None
    images = ImageMix.from_workload(parse_workload(workload)) if workload.get("kind") == "image" else None
    if workload.get("kind") in ("random", "image"):
        input_len, output_len = int(workload.get("input_len", 1024)), int(workload.get("output_len", 128))
    else:
        input_len = int(workload.get("prefix_len", 0)) + int(workload.get("suffix_len", 0))
        output_len = int(workload.get("output_len", 128))

    def predict(params: Mapping[str, Any]) -> dict[str, float] | None:
        flags = [*fixed_flags, *space.render(params)]
        if split_pd_flags(flags)[0] is not None:
            # no prediction for a PD split: the capacity curve is one instance's, and the split's own model
            # (sim/split.py, `estimate --pd`) gives medians only, not the SLO's percentiles
            return None
        try:
            p = plan(model, flags, gpu or "", max(num_gpus, 1))
        except UserError:
            return None
        if not p.budget.fits:
            return None
        best = at_capacity(capacity_curve(p, slo, input_len, output_len, requests, images=images))
        if best is None:
            return {"capacity": 0.0, "capacity_tps": 0.0}
        return {"capacity": float(best["c"]), "capacity_tps": best["tps"], "output_tps": best["tps"],
                "p50_tpot_ms": best["tpot50"], "p99_ttft_ms": best["ttft99"],
                "tps_per_gpu": best["tps"] / max(num_gpus, 1)}

    return predict
