"""The latency SLO: its grammar and its evaluation.

`ttft=1s` is shorthand for `ttft:p99<=1s`; the full form is a comma list such as
`ttft:p95<=800ms,tpot:p99<=50ms,e2el:p99<=10s`. A term may bound one class of requests only:
`ttft[image]:p99<=2s` holds the requests that carry images, `ttft[text]=1s` those that do not (a
vision-language model prefills and encodes images, so the two classes get different limits). Each term
becomes one Optuna constraint (`slo:<metric>:<stat>`, or `slo:<metric>[<class>]:<stat>`, measured minus
limit, feasible when <= 0), and per request the terms decide goodput (DistServe's definition: a request
counts when it meets every term that applies to its class).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from autotune.errors import UserError

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p90", "p95", "p99", "p99.9")
CLASSES = ("image", "text")   # requests with at least one image, and the others

_TERM = re.compile(
    r"^(?P<metric>[a-z0-9_]+)"
    r"(?:\[(?P<cls>[^\]]*)\])?"
    r"(?::(?P<stat>[a-z0-9.]+))?"
    r"\s*(?P<op><=|=)\s*"
    r"(?P<value>[0-9]*\.?[0-9]+)\s*(?P<unit>ms|s)?$"
)


class SLOError(UserError):
    """A malformed SLO; the message names the bad term."""


def stat_key(metric: str, stat: str, cls: str | None = None) -> str:
    """The `vllm bench serve` result key for a statistic (`p99` of `ttft` -> `p99_ttft_ms`); a class's
    own figures carry its name in front (`image_p99_ttft_ms`)."""
    if stat == "mean":
        key = f"mean_{metric}_ms"
    elif stat == "p50":
        key = f"median_{metric}_ms"
    else:
        key = f"{stat}_{metric}_ms"
    return f"{cls}_{key}" if cls else key


def request_class(images: int) -> str:
    """The class of a request by how many images it carries."""
    return "image" if images > 0 else "text"


@dataclass(frozen=True)
class SLOTerm:
    metric: str
    stat: str
    limit_ms: float
    cls: str | None = None     # "image" / "text": the term bounds that class of requests only

    @property
    def key(self) -> str:
        """Constraint name shared by studies, the store and exports."""
        return f"slo:{self.metric}{self._bracket}:{self.stat}"

    @property
    def _bracket(self) -> str:
        return f"[{self.cls}]" if self.cls else ""

    @property
    def metric_key(self) -> str:
        return stat_key(self.metric, self.stat, self.cls)

    @property
    def percentile(self) -> float | None:
        return None if self.stat == "mean" else float(self.stat[1:])

    def applies(self, images: int) -> bool:
        """Whether a request carrying `images` images is one this term bounds."""
        return self.cls is None or self.cls == request_class(images)

    def __str__(self) -> str:
        return f"{self.metric}{self._bracket}:{self.stat}<={self.limit_ms:g}ms"


@dataclass(frozen=True)
class SLO:
    terms: tuple[SLOTerm, ...]

    @classmethod
    def parse(cls, text: str) -> "SLO":
        if not isinstance(text, str) or not text.strip():
            raise SLOError("SLO is empty: give terms like ttft=1s or ttft:p95<=800ms,tpot:p99<=50ms")
        terms: dict[str, SLOTerm] = {}
        for raw in text.split(","):
            term = _parse_term(raw.strip())
            if term.key in terms:
                raise SLOError(f"SLO term {raw.strip()!r} repeats {term.key}")
            terms[term.key] = term
        return cls(tuple(terms.values()))

    @property
    def keys(self) -> list[str]:
        return [t.key for t in self.terms]

    @property
    def classes(self) -> set[str]:
        """The request classes some term bounds on its own."""
        return {t.cls for t in self.terms if t.cls}

    def margins(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Measured minus limit per term, in ms (the Optuna constraint values). A class term over a run
        that sent no request of its class is 0 (not held against it: nothing was measured); one whose
        requests all failed is infinite, like any term without a value."""
        out: dict[str, float] = {}
        for t in self.terms:
            value = metrics.get(t.metric_key)
            if value is None and t.cls is not None and f"{t.cls}_completed" not in metrics:
                out[t.key] = 0.0
                continue
            out[t.key] = float("inf") if value is None else float(value) - t.limit_ms
        return out

    def met(self, metrics: Mapping[str, float]) -> bool:
        return all(m <= 0 for m in self.margins(metrics).values())

    def request_ok(self, ttft_ms: float | None, tpot_ms: float | None, e2el_ms: float | None,
                   itl_ms: list[float] | tuple[float, ...] = (), images: int = 0) -> bool:
        """Whether one request met every term of its class (goodput). A percentile bound on ITL is
        checked against that request's own ITLs at the same percentile; the others are single values."""
        for t in self.terms:
            if not t.applies(images):
                continue
            if t.metric == "ttft":
                value = ttft_ms
            elif t.metric == "tpot":
                value = tpot_ms
            elif t.metric == "e2el":
                value = e2el_ms
            else:
                value = _own_percentile(itl_ms, t.percentile) if itl_ms else None
            if value is None:
                if t.metric in ("ttft", "e2el"):
                    return False
                continue  # one output token: no TPOT/ITL to violate
            if value > t.limit_ms:
                return False
        return True

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.terms)


def check_slo_classes(slo: SLO, workload: object) -> None:
    """A term on the image class needs a workload that sends images, one on the text class a workload that
    sends some requests without: otherwise the term has no request to judge and could never be met."""
    max_images = int(getattr(workload, "max_images", 0) or 0)
    share = getattr(workload, "share", None)
    kind = getattr(workload, "kind", "?")
    if "image" in slo.classes and not max_images:
        raise SLOError(f"SLO term on [image] requests, but workload {kind} sends no images")
    if "text" in slo.classes and share is not None and float(share) >= 1.0:
        raise SLOError(f"SLO term on [text] requests, but every request of workload {kind} carries images (share 1)")


def _own_percentile(values: list[float] | tuple[float, ...], pct: float | None) -> float:
    import numpy as np

    if pct is None:
        return float(np.mean(values))
    return float(np.percentile(values, pct))


def _parse_term(raw: str) -> SLOTerm:
    m = _TERM.match(raw.lower().replace(" ", ""))
    if not m:
        raise SLOError(f"SLO term {raw!r} is malformed: write METRIC=VALUE or METRIC[CLASS]:STAT<=VALUE, "
                       f"e.g. ttft=1s, tpot:p99<=50ms or ttft[image]:p99<=2s")
    metric, stat, value, unit = m["metric"], m["stat"], float(m["value"]), m["unit"]
    if metric not in METRICS:
        raise SLOError(f"SLO term {raw!r}: unknown metric {metric!r} (one of {', '.join(METRICS)})")
    cls = m["cls"]
    if cls is not None and cls not in CLASSES:
        raise SLOError(f"SLO term {raw!r}: unknown request class {cls!r} (one of {', '.join(CLASSES)}, "
                       f"e.g. {metric}[image]:p99<=2s)")
    if stat is None:
        if m["op"] != "=":
            raise SLOError(f"SLO term {raw!r}: write {metric}:p99<=... or {metric}=...")
        stat = "p99"
    elif m["op"] != "<=":
        raise SLOError(f"SLO term {raw!r}: a statistic takes '<=', e.g. {metric}:{stat}<=1s")
    if stat == "median":
        stat = "p50"
    if stat not in STATS:
        raise SLOError(f"SLO term {raw!r}: unknown statistic {stat!r} (one of {', '.join(STATS)})")
    if unit is None:
        raise SLOError(f"SLO term {raw!r}: give a unit, ms or s")
    limit_ms = value * 1000.0 if unit == "s" else value
    if limit_ms <= 0:
        raise SLOError(f"SLO term {raw!r}: the limit must be positive")
    return SLOTerm(metric, stat, limit_ms, cls)
