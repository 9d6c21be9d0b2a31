"""Ending a load step early once its SLO is lost, so a capacity search does not spend minutes measuring a
load it already knows is too high.

Two rules, both per SLO term. *Certain*: the requests that already broke the limit (failed ones, and
ones still in flight that are past a TTFT or E2EL limit without the token they need) are so many that
the final percentile over the step's N requests must exceed it whatever the rest do. *Clear*: among at
least `min_samples` finished requests, the lower end of a 99.9 % Wilson interval on the share breaking
the limit is above what the percentile allows (mean terms: the mean's lower bound is above the limit).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from autotune.bench.client import Live
from autotune.bench.results import RequestRecord
from autotune.slo import SLO, SLOTerm

Z_999 = 3.29  # two-sided 99.9 %: an abort on noise should be rarer than one step in a thousand


def wilson_lower(k: int, n: int, z: float = Z_999) -> float:
    if n == 0:
        return 0.0
    f = k / n
    z2 = z * z
    return (f + z2 / (2 * n) - z * math.sqrt(f * (1 - f) / n + z2 / (4 * n * n))) / (1 + z2 / n)


def certain_violators_needed(total: int, pct: float) -> int:
    """Fewest values above the limit that force numpy's linear percentile `pct` of `total` values above
    it: the interpolation's lower neighbour, index floor((N-1)p/100), is then itself a violator."""
    return total - math.floor((total - 1) * pct / 100.0)


class EarlyAbort:
    def __init__(self, slo: SLO, total: int | None, min_samples: int = 20) -> None:
        self.slo, self.total, self.min_samples = slo, total, max(2, min_samples)

    def check(self, done: Sequence[RequestRecord], live: Iterable[Live], now: float) -> str | None:
        """A one-line reason when the step's SLO is already lost, else None."""
        live = list(live)
        for term in self.slo.terms:
            reason = self._term(term, done, live, now)
            if reason:
                return f"{term}: {reason}"
        return None

    def _term(self, t: SLOTerm, done: Sequence[RequestRecord], live: list[Live], now: float) -> str | None:
        total = self.total
        if t.cls is not None:
            # a class's term judges that class's requests; how many of them the step sends is not known
            # in advance, so the 'certain' rule (which needs the step's total) does not apply
            done = [r for r in done if t.applies(r.images)]
            live = [x for x in live if t.applies(x.images)]
            total = None
        failed = sum(1 for r in done if not r.ok)
        if t.metric == "itl":
            values = [x for r in done if r.ok for x in r.itl_ms]
            over_live = 0
        else:
            values = [v for r in done if r.ok and (v := _value(r, t.metric)) is not None]
            over_live = _censored(t, live, now)
        over = sum(1 for v in values if v > t.limit_ms)
        n_done = len(values) + (0 if t.metric == "itl" else failed)
        if t.percentile is None:
            if failed and t.metric != "itl":
                return f"{failed} failed request(s) make the mean unbounded"
            if len(values) >= self.min_samples:
                arr = np.asarray(values)
                low = arr.mean() - Z_999 * arr.std(ddof=1) / math.sqrt(len(arr))
                if low > t.limit_ms:
                    return f"mean of {len(arr)} samples is at least {low:.1f} ms"
            return None
        allowed = 1.0 - t.percentile / 100.0
        bad = over + (0 if t.metric == "itl" else failed) + over_live
        if total and t.metric != "itl" and bad >= certain_violators_needed(total, t.percentile):
            return f"{bad} of {total} requests already over the limit"
        finished_bad = over + (0 if t.metric == "itl" else failed)
        if len([r for r in done]) >= self.min_samples and n_done and \
                wilson_lower(finished_bad, n_done) > allowed:
            return f"{finished_bad} of {n_done} samples over the limit"
        return None


def _value(r: RequestRecord, metric: str) -> float | None:
    return r.ttft_ms if metric == "ttft" else r.e2el_ms if metric == "e2el" else r.tpot_ms


def _censored(t: SLOTerm, live: list[Live], now: float) -> int:
    """Requests in flight that have already broken a TTFT or E2EL limit."""
    limit_s = t.limit_ms / 1000.0
    if t.metric == "ttft":
        return sum(1 for x in live if x.first is None and now - x.start > limit_s)
    if t.metric == "e2el":
        return sum(1 for x in live if now - x.start > limit_s)
    return 0
