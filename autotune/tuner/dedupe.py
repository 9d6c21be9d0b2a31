"""A candidate identical to one already run (the same rendered flags) is not run again: a repeat
costs a whole launch and teaches the sampler nothing a confirmation round would not teach better.
It does not count toward `--n-trials`. TPE can fall into proposing the same point over and over once
its model is confident, so after a stretch of duplicates the next candidate is a random draw from the
space (inside every known and learned limit) instead.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Callable, Mapping, Sequence

from autotune.flags import flags_to_mapping
from autotune.space.params import ParamSpec

STRETCH = 3          # duplicates in a row before the next candidate is drawn at random
DRAW_TRIES = 500     # random draws tried before the space is taken as exhausted


def flags_key(flags: Sequence[str]) -> str:
    """Order-free identity of a command line: the same flags in another order are the same candidate."""
    return json.dumps(flags_to_mapping(list(flags)), sort_keys=True, default=str)


class Seen:
    """Rendered candidates already run in this study -> the trial that ran them."""

    def __init__(self) -> None:
        self._by_key: dict[str, int] = {}
        self.stretch = 0          # duplicates proposed in a row

    def add(self, flags: Sequence[str], number: int) -> None:
        self._by_key.setdefault(flags_key(flags), number)

    def earlier(self, flags: Sequence[str]) -> int | None:
        return self._by_key.get(flags_key(flags))

    def note(self, duplicate: bool) -> bool:
        """Count a proposal; True when the stretch of duplicates calls for a random draw next."""
        self.stretch = self.stretch + 1 if duplicate else 0
        return self.stretch >= STRETCH

    def __len__(self) -> int:
        return len(self._by_key)


def draw_value(p: ParamSpec, rng: random.Random) -> Any:
    """One value from a parameter's distribution, as Optuna's random sampler would draw it."""
    if p.kind in ("bool", "categorical"):
        return rng.choice(list(p.choices))
    low, high = float(p.low), float(p.high)      # type: ignore[arg-type]
    if p.log:
        x = math.exp(rng.uniform(math.log(low), math.log(high)))
    else:
        x = rng.uniform(low, high)
    if p.step:
        x = low + round((x - low) / float(p.step)) * float(p.step)
        x = min(max(x, low), high)
    if p.kind == "int":
        return int(round(x))
    return round(x, 10)


def draw(params: Mapping[str, ParamSpec], order: Sequence[ParamSpec], rng: random.Random) -> dict[str, Any]:
    """A random candidate: parents before the params conditional on them, inactive ones left out."""
    chosen: dict[str, Any] = {}
    for p in order:
        if all(chosen.get(parent) in allowed for parent, allowed in p.when.items()):
            chosen[p.name] = draw_value(p, rng)
    return chosen


def random_candidate(params: Mapping[str, ParamSpec], order: Sequence[ParamSpec], rng: random.Random,
                     accept: Callable[[dict[str, Any]], bool], tries: int = DRAW_TRIES) -> dict[str, Any] | None:
    """The first random draw `accept` takes (not run yet, inside the limits), or None: nothing left."""
    for _ in range(tries):
        cand = draw(params, order, rng)
        if accept(cand):
            return cand
    return None
