"""The search policy around the sampler: what is not launched (duplicates, candidates outside a learned
limit), what a failure teaches (narrowing.py), when a stretch of duplicates calls for a random draw
(dedupe.py), and when a trial's capacity search may stop early (earlystop.py).

Pure of I/O: the study loop and the search benchmark (benchmarks/search/run.py) drive the same object,
the loop with real trials and the benchmark with a simulated landscape, so the benchmark measures the
policy that ships.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import causes
from autotune.flags import flags_to_mapping
from autotune.space import SearchSpace
from autotune.tuner.dedupe import Seen, random_candidate
from autotune.tuner.earlystop import EarlyStop
from autotune.tuner.narrowing import LearnedLimits, Limit, limit_from_failure

FREE = "free"                # user attr of a candidate rejected without a launch that does not count
DUPLICATE = "duplicate"      # TrialRecord.state of a candidate whose flags already ran
MAX_FREE_IN_A_ROW = 200      # proposals rejected in a row before the study stops: the space is spent


@dataclass(frozen=True)
class Screen:
    """Why a candidate is not launched."""

    kind: str                  # DUPLICATE | causes.CONSTRAINT (outside a learned limit)
    detail: str
    earlier: int | None = None   # the trial that already ran these flags


class SearchPolicy:
    def __init__(self, space: SearchSpace, fixed_flags: Sequence[str], num_gpus: int, *, dedupe: bool = True,
                 narrow: bool = True, early_stop: bool = True, device_gib: float | None = None, seed: int = 0):
        self.space, self.fixed_flags, self.num_gpus = space, list(fixed_flags), num_gpus
        self.dedupe, self.narrow, self.early_stop = dedupe, narrow, early_stop
        self.device_gib = device_gib
        self.limits = LearnedLimits()
        self.seen = Seen()
        self.rng = random.Random(seed)
        self.free_in_a_row = 0
        self.nothing_new = False     # a random fallback found no candidate: none will later either
        self.layouts = {v: dict(p.layouts[v]) for p in space.params.values() for v in p.layouts}

    # -- before a launch ----------------------------------------------------------------------------
    def screen(self, params: Mapping[str, Any], flags: Sequence[str], role: str) -> Screen | None:
        """None when the candidate should launch. Confirmation repeats are never screened. `flags` is the
        launch's identity: its flags with its env knobs (dedupe.with_env)."""
        if role == "confirm":
            return None
        if self.dedupe and (n := self.seen.earlier(flags)) is not None:
            return Screen(DUPLICATE, f"same flags as trial {n}: not run again", n)
        if self.narrow and role != "baseline":
            lim = self.limits.violation(params, self.layouts)
            if lim is not None:
                return Screen(causes.CONSTRAINT, f"outside a limit learned from a failure: {lim.text()}")
        return None

    def proposed(self, screened: Screen | None) -> bool:
        """Count a proposal; True when the next candidate should be a random draw (a stretch of
        duplicates: the sampler is stuck on points it has already measured)."""
        self.free_in_a_row = self.free_in_a_row + 1 if screened is not None else 0
        return self.seen.note(screened is not None and screened.kind == DUPLICATE)

    def fallback(self) -> dict[str, Any] | None:
        """A random candidate inside the known constraints and the learned limits, never run yet. Once
        the draws found none, later calls return None at once: what they accept only shrinks (more
        candidates run, limits only tighten), and each search costs DRAW_TRIES checks of the space."""
        if self.nothing_new:
            return None

        def accept(cand: dict[str, Any]) -> bool:
            if self.space.violations(cand, self.fixed_flags, self.num_gpus):
                return False
            return self.screen(cand, self.space.launch_key(cand), "search") is None

        cand = random_candidate(self.space.params, self.space._ordered(), self.rng, accept)
        self.nothing_new = cand is None
        return cand

    @property
    def exhausted(self) -> bool:
        return self.free_in_a_row >= MAX_FREE_IN_A_ROW

    # -- after a launch -----------------------------------------------------------------------------
    def ran(self, flags: Sequence[str], number: int) -> None:
        self.seen.add(flags, number)

    def learn(self, number: int, cause: str | None, detail: str | None,
              params: Mapping[str, Any], flags: Sequence[str] = ()) -> Limit | None:
        """The limit a failure states, when it is new and tighter than what the study knew."""
        if not self.narrow:
            return None
        effective = {**flags_to_mapping(self.fixed_flags), **flags_to_mapping(list(flags))}
        lim = limit_from_failure(cause, detail, params, effective=_typed(effective),
                                 device_gib=self.device_gib, trial=number)
        if lim is not None and self.limits.add(lim):
            return lim
        return None

    def stopper(self, objectives: Sequence[str], directions: Sequence[str], front: Sequence[Sequence[float]],
                integer: bool = True) -> EarlyStop | None:
        if not self.early_stop or not front:
            return None
        return EarlyStop(objectives, directions, front, integer=integer, num_gpus=self.num_gpus)


def _typed(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values read back from a command line are strings; numbers are wanted where they are numbers."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        if isinstance(v, str):
            try:
                v = float(v) if "." in v else int(v)
            except ValueError:
                pass
        out[k] = v
    return out


# -- Optuna side (shared by the study loop and the benchmark) -----------------------------------------
def counted(t: FrozenTrial) -> bool:
    """A COMPLETE trial that counts toward --n-trials (free rejections do not)."""
    return t.state == TrialState.COMPLETE and not t.user_attrs.get(FREE)


def duplicate_told(study: optuna.Study, earlier: int) -> tuple[list[float], dict[str, float]] | None:
    """What the trial that already ran these flags told Optuna: a duplicate repeats it, so the
    sampler sees the point once more with the same evidence rather than a made-up value."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number == earlier and t.values is not None:
            return list(t.values), {k: float(v) for k, v in t.constraints.items()}
    return None
