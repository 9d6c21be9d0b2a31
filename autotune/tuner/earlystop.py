"""Early stopping inside a trial: end the capacity search as soon as the steps already measured bound
the candidate so tightly that, even at the best the bound allows, the incumbent front dominates it.

Once a step has broken the SLO at load H and one below it met it at load L, the capacity lies in
[L, H). The bound on each objective at that capacity uses two facts of a serving engine under a closed
loop (or a rate):

- per-stream speed does not rise with load, so throughput at any C >= L is at most C x tps(L) / L,
  and throughput does not fall with load, so at any C < H it is at most tps(H) when the step at H ran
  to the end: `capacity_tps` <= min of the two at C = H - 1 (concurrency) or just below H (rate);
- latency does not fall with load, so `p50_tpot_ms` and `p99_ttft_ms` at the capacity are at least
  what the step at L measured.

Measurements move by ~5 % between repeats (benchmarks/gpu/RESULTS.md), so every bound is widened by
that much. An objective with no bound from load steps (energy, headroom) never lets a trial stop. A
stopped trial is told to the sampler with the bound as its values, so it still learns the region is
poor, and it is never exported: its values are a bound, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

NOISE_SLACK = 0.05
_MAXIMIZE = {"capacity_tps", "output_tps", "tps_per_gpu"}
_LATENCY = {"p50_tpot_ms": "tpot", "p99_ttft_ms": "ttft"}


@dataclass(frozen=True)
class StepView:
    """What the bound needs of one load step (from bench.results.LoadStep or a simulated one)."""

    load: float
    met: bool
    tps: float | None          # output tok/s of the step (steady window where measured)
    tpot: float | None         # p50 TPOT ms
    ttft: float | None         # p99 TTFT ms
    aborted: bool = False      # cut short: its throughput is not a full step's


def step_view(step: Any) -> StepView:
    """A bench LoadStep as the bound reads it."""
    from autotune.bench.metrics import capacity_tps

    m = step.measurement.metrics
    return StepView(float(step.load), bool(step.slo_met), capacity_tps(m), m.get("median_tpot_ms"),
                    m.get("p99_ttft_ms"), bool(step.measurement.aborted_early))


def capacity_bound(steps: Sequence[StepView], objectives: Sequence[str], *, integer: bool = True,
                   num_gpus: int = 1) -> dict[str, float] | None:
    """The best each objective can still be at this candidate's capacity, or None while no step has
    both met and broken the SLO (the capacity is not bracketed yet) or an objective has no bound."""
    fails = [s for s in steps if not s.met]
    if not fails:
        return None
    hi = min(fails, key=lambda s: s.load)
    passing = [s for s in steps if s.met and s.load < hi.load]
    if not passing:
        return None
    lo = max(passing, key=lambda s: s.load)
    top = hi.load - 1 if integer else hi.load
    top = max(top, lo.load)
    out: dict[str, float] = {}
    for name in objectives:
        if name in _MAXIMIZE:
            if lo.tps is None or lo.load <= 0:
                return None
            tps = top * lo.tps / lo.load
            if hi.tps is not None and not hi.aborted:
                tps = min(tps, hi.tps)
            tps = max(tps, lo.tps) * (1 + NOISE_SLACK)
            out[name] = tps / max(num_gpus, 1) if name == "tps_per_gpu" else tps
        elif name in _LATENCY:
            value = getattr(lo, _LATENCY[name])
            if value is None:
                return None
            out[name] = value * (1 - NOISE_SLACK)
        else:
            return None
    return out


def dominated(bound: Sequence[float], front: Iterable[Sequence[float]], maximize: Sequence[bool]) -> bool:
    """Some incumbent is at least as good on every objective and better on one."""
    for f in front:
        if len(f) != len(bound):
            continue
        ge = all((a >= b) if mx else (a <= b) for a, b, mx in zip(f, bound, maximize))
        gt = any((a > b) if mx else (a < b) for a, b, mx in zip(f, bound, maximize))
        if ge and gt:
            return True
    return False


class EarlyStop:
    """Asked before every further load step of one trial's capacity search (`find_capacity(should_stop=...)`):
    a search that would end anyway keeps its measurement."""

    def __init__(self, objectives: Sequence[str], directions: Sequence[str], front: Iterable[Sequence[float]],
                 *, integer: bool = True, num_gpus: int = 1):
        self.objectives = list(objectives)
        self.maximize = [d == "maximize" for d in directions]
        self.front = [list(f) for f in front]
        self.integer, self.num_gpus = integer, num_gpus
        self.bound: dict[str, float] | None = None    # set when the search was stopped

    def should_stop(self, steps: Sequence[Any]) -> bool:
        if not self.front:
            return False
        views = [s if isinstance(s, StepView) else step_view(s) for s in steps]
        b = capacity_bound(views, self.objectives, integer=self.integer, num_gpus=self.num_gpus)
        if b is None:
            return False
        if dominated([b[n] for n in self.objectives], self.front, self.maximize):
            self.bound = b
            return True
        return False

    @property
    def stopped(self) -> bool:
        return self.bound is not None


def bound_text(bound: dict[str, float]) -> str:
    """`capacity_tps <= 2,512, p50_tpot_ms >= 8.1`: what `show` prints for a stopped trial."""
    return ", ".join(f"{k} {'<=' if k in _MAXIMIZE else '>='} {v:,.4g}" for k, v in bound.items())


def mark_stopped(outcome: Any, bound: dict[str, float] | None) -> None:
    """Turn a trial outcome into an early-stopped one: its values are the bound (told to the sampler,
    never stored as measurements, never exported)."""
    from autotune import causes

    bound = dict(bound or {})
    outcome.state, outcome.cause = "stopped", causes.EARLY_STOPPED
    outcome.detail = f"capacity search stopped early, dominated by the front at its bound: {bound_text(bound)}"
    outcome.observed = {**outcome.observed, **bound}
    if outcome.capacity is not None:
        outcome.capacity["bound"] = bound
        outcome.capacity["early_stopped"] = True
