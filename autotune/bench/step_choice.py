"""Which load a capacity search measures next, from the steps so far (bench/capacity.py measures them).

A probe at one stream measures the server's unloaded speed; from it the next load is a guess scaled by
the headroom the probe left. While every step passes, the next load extrapolates the SLO terms' relative
margins (measured / limit - 1) linearly through the last two steps, bounded by what the met steps say
about where requests begin to queue (step_bounds.py); latency curves bend upward with load, so the line
overshoots and a failing step brackets the crossing quickly. Inside the bracket, the secant (regula
falsi) picks the next load, kept away from the bracket's ends so that a bent curve cannot stall it on
one side. `step_plan` is the order of it all (first load, probe fallback, step budget, refinement of a
wide bracket, a load the caller must settle), so that the search over HTTP, the search benchmark's
simulated trials and the tests take the same steps.
"""

from __future__ import annotations

import math
from typing import Callable, Generator

from autotune.bench.step_bounds import ServerLimits, StepEvidence, ceiling, term_crossing

MARGIN_CAP = 4.0           # an aborted step's margin is a lower bound; beyond 5x the limit it says little
DEFAULT_TOLERANCE = 0.03   # stop once the bracket is this narrow relative to its lower end
FINAL_SHAVE = 0.01         # the last step aims this much below the estimated crossing
GUARD = 0.1                # fraction of the bracket kept clear at each end
DEFAULT_MAX_BRACKET = 0.25 # a capacity known only within +-25 % cannot rank configs that differ by 5 %
DEFAULT_REFINE_STEPS = 2   # extra steps a wide bracket may spend before the trial is flagged instead
BELOW_HINT = 0.75          # after a hinted first step breaks, the next aims this far below it
DESCENT = 0.5              # each further step down while the steps below a broken hint break too
MAX_BELOW = 3              # steps below a broken hint before the probe at one stream


class StepSearch:
    """The choice of the next load from the steps so far. `hinted`: the first step was a hint's met end,
    near the expected crossing, so a single passing step grows by its headroom (1.25x-4x) instead of the
    probe's 4x-16x, and at least to `expect_broken` (the hint's broken end) where there is one."""

    def __init__(self, integer: bool, upper: float, tolerance: float, hinted: bool = False,
                 expect_broken: float | None = None, limits: ServerLimits | None = None) -> None:
        self.integer, self.upper, self.tolerance = integer, upper, tolerance
        self.hinted, self.expect_broken = hinted, expect_broken
        self.limits = limits            # the server's batch and KV-cache limits (step_bounds.py)
        self.points: list[tuple[float, float, bool]] = []   # (load, relative margin, met)
        self.cut: set[float] = set()    # loads whose step was cut short: their margin is a lower bound
        self.evidence: dict[float, StepEvidence] = {}   # met loads -> what their step measured
        self.refined = 0                # steps step_plan spent refining a wide bracket

    def add(self, load: float, margin: float, met: bool, cut_short: bool = False,
            evidence: StepEvidence | None = None) -> None:
        self.points.append((load, margin, met))
        if cut_short:
            self.cut.add(load)
        if met and evidence is not None:
            self.evidence[load] = evidence

    def bracket(self) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
        fails = [(x, m) for x, m, ok in self.points if not ok]
        hi = min(fails) if fails else None
        passes = [(x, m) for x, m, ok in self.points if ok and (hi is None or x < hi[0])]
        return (max(passes) if passes else None), hi

    def next_load(self, final: bool = False) -> float | None:
        """The next load to measure, None when done. On the `final` step the aim drops by FINAL_SHAVE:
        only a passing step can raise the answer, and near the crossing a step passes or fails by noise."""
        lo, hi = self.bracket()
        if lo is None:
            return None                                 # even the lowest load broke the SLO
        if hi is None:
            if lo[0] >= self.upper:
                return None                             # passes at the cap: capacity is the cap
            return self._round(min(self.upper, self._extrapolate(lo), self._ceiling(lo)), above=lo[0])
        if self.integer and hi[0] - lo[0] <= 1:
            return None
        if (hi[0] - lo[0]) / lo[0] <= self.tolerance:
            return None
        x = self._inside(lo, hi) * (1.0 - FINAL_SHAVE if final else 1.0)
        w = hi[0] - lo[0]
        x = min(max(x, lo[0] + GUARD * w), hi[0] - GUARD * w)
        if hi[0] in self.cut:       # a broken end cut short says little: the met end's evidence bounds the aim
            x = min(x, self._ceiling(lo))
        if self.integer:
            return float(min(max(int(round(x)), int(lo[0]) + 1), int(hi[0]) - 1))
        x = self._round(x, above=lo[0])
        return x if x < hi[0] else None

    def _inside(self, lo: tuple[float, float], hi: tuple[float, float]) -> float:
        """Latency rises convexly with load, so the chord from the passing end to the failing end crosses
        the limit below the truth, and the line through the two highest passing loads crosses above it:
        aim between the two. A failing end that was cut short knows only its first, fastest requests:
        its margin understates the overload and a chord through it lands next to it (seen on the CPU
        build: 96, 83, 76, 70, each cut short), so there the bracket is halved on the log scale."""
        if hi[0] in self.cut and lo[0] > 0:
            return math.sqrt(lo[0] * hi[0])
        chord = lo[0] + (hi[0] - lo[0]) * (-lo[1]) / (hi[1] - lo[1]) if hi[1] > lo[1] else (lo[0] + hi[0]) / 2
        below = sorted((x, m) for x, m, ok in self.points if ok and x <= lo[0])
        if len(below) >= 2:
            (x0, m0), (x1, m1) = below[-2], below[-1]
            if m1 > m0 and x1 > x0:
                ahead = min(hi[0], x1 + (-m1) * (x1 - x0) / (m1 - m0))
                if ahead > chord:
                    return chord + self._lean() * (ahead - chord)
        return chord

    def _lean(self) -> float:
        """How far from the chord toward the line from below: half way, unless the last two steps both
        failed, which says the truth lies nearer the chord than the line claims."""
        last = self.points[-2:]
        return 0.0 if len(last) == 2 and not last[0][2] and not last[1][2] else 0.5

    def _ceiling(self, lo: tuple[float, float]) -> float:
        """The bound the evidence of the highest met step puts on the next load (step_bounds.py)."""
        ev = self.evidence.get(lo[0])
        if ev is None:
            return math.inf
        below = [(x, e) for x, e in self.evidence.items() if x < lo[0]]
        bound = ceiling(lo[0], ev, below, self.limits, self.integer)
        return math.inf if bound is None else bound

    def _extrapolate(self, lo: tuple[float, float]) -> float:
        passing = sorted((x, m) for x, m, ok in self.points if ok)
        x1, m1 = lo
        # the line through the highest two met steps, or where noise had the margin fall between them,
        # through the lowest and the highest (a single point's growth below is the probe's)
        for x0, m0 in dict.fromkeys([passing[-2], passing[0]]) if len(passing) >= 2 else []:
            # each SLO term's own line where both steps measured it, else the worst term's
            guess = term_crossing((x1, self.evidence[x1]), (x0, self.evidence[x0])) \
                if x1 in self.evidence and x0 in self.evidence else None
            if guess is None and m1 > m0 and x1 > x0:
                guess = x1 + (0.0 - m1) * (x1 - x0) / (m1 - m0)
            if guess is not None:
                return min(max(guess, x1 * 1.25), x1 * 8)
        ratio = 1.0 / max(1.0 + m1, 1e-3)
        if self.hinted and len(passing) == 1:
            # one point at a hinted load: the hint's broken end, or further where the margin says the
            # candidate has far more headroom than the study's earlier trials (a linear guess)
            if self.expect_broken is not None and self.expect_broken > x1:
                return max(self.expect_broken, x1 * min(4.0, ratio))
            return x1 * min(4.0, max(1.25, ratio))
        # one point: grow with the headroom left (limit / measured), at least 4x, at most 16x
        return x1 * min(16.0, max(4.0, 2.0 * ratio))

    def _round(self, x: float, above: float) -> float:
        if self.integer:
            return float(max(int(above) + 1, int(round(x))))
        return float(f"{x:.3g}") if x > 0 else x


def step_plan(search: StepSearch, first: float, *, probe: bool, max_steps: int, refine_steps: int = DEFAULT_REFINE_STEPS,
              max_bracket: float = DEFAULT_MAX_BRACKET, check: float | None = None,
              should_stop: Callable[[], bool] | None = None, below_hint: float | None = BELOW_HINT,
              descent: float | None = DESCENT) -> Generator[tuple[float, bool], bool, None]:
    """The loads to measure, in order, as (load, is the probe). The caller measures each, adds it to
    `search` and sends back whether it met the SLO. `first` is the start (a hint's met end when
    `search.hinted`); a hinted first step that breaks is followed by one `below_hint` of it and, while the
    steps below break too, by steps `descent` of the last (at most MAX_BELOW below the hint in all), then by
    the probe (a broken step below counts against no budget: a search whose hint was far off keeps every
    step it had before). Then up to `max_steps` in all while `search` has a next load and
    `should_stop()` (early stopping) is False; then up to `refine_steps` while the bracket is wider than
    `max_bracket`; then `check`, a load whose pass or fail must be settled, when it lies strictly inside
    the bracket.

    Why a step down before the probe: a study's candidates mostly land near its earlier capacities, so one
    that breaks at the hint is usually a little below it. On the H200 (benchmarks/gpu/knobs) two trials
    broke at 29 and 26 streams and measured 23 and 21; from the probe at one stream the bracket (1, hint)
    took 5 more full steps to close, where a met step at 3/4 of the hint leaves (3/4, 1) of it. A
    candidate far below costs one more step, cut short like the first, and not one of its budget (a
    confirmation repeat with 4 steps that lost one to it read a plateau's tokens/s at half). `below_hint=None`:
    the probe at once (the search before; benchmarks/search/steps.py compares the two).

    Why further down before the probe: on an H100 (benchmarks/gpu/knobs) a decode-heavy trial broke at its
    hint of 362 streams and at 271, then took the probe and five steps up from it (28, 87, 154, 202, 234)
    to a capacity of 234, where a met step at half of 271 starts from the bracket (135, 271); there the
    probe, 24 answers of 512 tokens one after another, is itself a step of over a minute. `descent=None`:
    the probe right after the step at `below_hint`."""
    met = yield first, probe
    taken = 1
    if search.hinted and not met and max_steps > 2:
        down, below = _below(first, below_hint, search.integer), 0
        while down is not None and below < MAX_BELOW:
            met = yield down, False
            below += 1
            if met:
                break
            down = _below(down, descent, search.integer)
        if not met:             # the hint was far above this candidate's capacity: probe as without one
            yield 1.0, True
        taken += 1              # the met step below, or the probe: a broken step below is not counted
    while taken < max_steps:
        nxt = search.next_load(final=taken == max_steps - 1)
        if nxt is None or (should_stop is not None and should_stop()):   # search hook: tuner/earlystop.py
            break
        yield nxt, False
        taken += 1
    while search.refined < refine_steps and is_wide(search.bracket(), search.integer, search.upper, max_bracket):
        nxt = search.next_load(final=search.refined == refine_steps - 1)
        if nxt is None:
            break
        search.refined += 1
        yield nxt, False
    lo, hi = search.bracket()
    if check is not None and lo is not None:
        x = float(int(check)) if search.integer else float(check)
        if lo[0] < x <= search.upper and (hi is None or x < hi[0]):
            yield x, False


def _below(first: float, factor: float | None, integer: bool) -> float | None:
    """The load a step below a broken hinted start measures; None where only the probe is left below."""
    if factor is None:
        return None
    if integer:
        x = float(int(first * factor))
        return x if 1 < x < first else None
    x = float(f"{first * factor:.3g}")
    return x if 0 < x < first else None


def is_wide(bracket: tuple[tuple[float, float] | None, tuple[float, float] | None], integer: bool,
            upper: float, max_bracket: float) -> bool:
    """Whether the highest met and lowest broken load are further apart than `max_bracket` of the lower
    one. A search that never broke the SLO below its cap knows only a lower bound: wide. Adjacent
    integers are as narrow as a concurrency bracket gets."""
    lo, hi = bracket
    if lo is None:
        return False
    if hi is None:
        return lo[0] < upper
    if integer and hi[0] - lo[0] <= 1:
        return False
    return (hi[0] - lo[0]) / lo[0] > max_bracket
