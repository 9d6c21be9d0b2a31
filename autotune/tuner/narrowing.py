"""Learn from failures that state their limit: a startup failure whose vLLM line names the bound
narrows the space for the rest of the study, so the sampler is never again allowed to spend a launch
(a minute or more of a GPU) on a candidate that line already ruled out.

The lines read here (benchmarks/gpu, tests/fixtures/logs), with the limit each one gives:

- "Free memory on device cuda:0 (58.69/139.8 GiB) on startup is less than desired GPU memory
  utilization (0.81, 113.24 GiB)" (and the CPU build's "Available memory on node 0 (6.82/8.21 GiB)"):
  no memory fraction above 58.69 / 139.8 minus a margin, on that host.
- "To serve at least one request with the model's max seq len (8192), (1.0 GiB KV cache is needed,
  which is larger than the available KV cache memory (0.09 GiB)": no memory fraction at or below the one
  that failed (raised by the missing GiB over the device's size when that is known).
- "max_num_batched_tokens (2048) is smaller than max_model_len (4096)": with chunked prefill off, no
  token budget below 4096.
- "... larger than the number of available GPUs (4)": no layout needing more than 4 GPUs.

A limit is a plain record (param, op, value, reason, trial), so it can be stored, shown and applied
the same way by the study loop and by the search benchmark.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from autotune import causes

MEMORY_MARGIN = 0.01      # below the fraction the free memory allows: other processes' memory moves a little
GPUS = "gpus"             # the pseudo-parameter a GPU-count limit applies to (TP x PP x DP of a candidate)
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_FREE = re.compile(r"(?:Free memory on device|Available memory on node)\s*\S*\s*\(" + _NUM + r"\s*/\s*" + _NUM
                   + r"\s*GiB\)", re.I)
_KV = re.compile(r"max seq len \(" + _NUM + r"\).*?\(" + _NUM + r"\s*GiB KV cache is needed.*?available KV cache "
                 r"memory \(" + _NUM + r"\s*GiB\)", re.I | re.S)
_BATCHED = re.compile(r"max_num_batched_tokens \(" + _NUM + r"\) is smaller than max_model_len \(" + _NUM + r"\)", re.I)
_GPUS = re.compile(r"(?:number of )?available GPUs \(" + _NUM + r"\)|only " + _NUM + r" GPUs? (?:are )?available", re.I)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class Limit:
    param: str                # a search-space parameter name, or GPUS
    op: str                   # "<=" or ">="
    value: float
    reason: str               # the vLLM line it was read from, shortened
    trial: int | None = None  # the trial whose failure taught it
    when: Mapping[str, Any] = field(default_factory=dict)   # applies only to candidates with these values

    def allows(self, value: Any) -> bool:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        return value <= self.value + 1e-9 if self.op == "<=" else value >= self.value - 1e-9

    def text(self) -> str:
        cond = "".join(f" when {k}={v}" for k, v in self.when.items())
        who = f" (trial {self.trial})" if self.trial is not None else ""
        return f"{self.param} {self.op} {self.value:g}{cond}{who}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "when": dict(self.when)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Limit":
        return cls(str(doc["param"]), str(doc["op"]), float(doc["value"]), str(doc.get("reason", "")),
                   doc.get("trial"), dict(doc.get("when") or {}))


def limit_from_failure(cause: str | None, detail: str | None, params: Mapping[str, Any], *,
                       effective: Mapping[str, Any] | None = None, device_gib: float | None = None,
                       trial: int | None = None) -> Limit | None:
    """The bound a failed start states, or None when its line states none. `params` are the candidate's
    searched values; `effective` the flags it ran with (fixed ones included, underscore names), used
    for what the candidate left to vLLM's defaults."""
    text = detail or ""
    eff = {**(effective or {}), **params}
    if cause == causes.STARTUP_OOM:
        m = _FREE.search(text)
        if m:
            free, total = _num(m.group(1)), _num(m.group(2))
            if total > 0:
                return Limit("gpu_memory_utilization", "<=", round(free / total - MEMORY_MARGIN, 4),
                             f"free memory {free:g}/{total:g} GiB at startup", trial)
    if cause == causes.KV_TOO_SMALL:
        m = _KV.search(text)
        gmu = eff.get("gpu_memory_utilization")
        if m and isinstance(gmu, (int, float)):
            need, have = _num(m.group(2)), _num(m.group(3))
            step = (need - have) / device_gib if device_gib else 0.0
            return Limit("gpu_memory_utilization", ">=", round(float(gmu) + max(step, 0.01), 4),
                         f"KV cache {have:g} GiB < {need:g} GiB needed for one max-length request", trial)
    m = _BATCHED.search(text)
    if m:
        need = _num(m.group(2))
        when = {"enable_chunked_prefill": False} if eff.get("enable_chunked_prefill") is False else {}
        return Limit("max_num_batched_tokens", ">=", need,
                     f"max_num_batched_tokens below max_model_len ({need:g})", trial, when)
    m = _GPUS.search(text)
    if m:
        n = _num(m.group(1) or m.group(2))
        return Limit(GPUS, "<=", n, f"{n:g} GPU(s) available", trial)
    return None


def gpus_needed(params: Mapping[str, Any], layouts: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """TP x PP x DP of a candidate (times its instances for a PD layout), from its explicit sizes or its
    composite layout choice."""
    from autotune.pdlayout import gpus_of

    flat = dict(params)
    for value in params.values():
        if layouts and isinstance(value, str) and value in layouts:
            flat.update(layouts[value])
    return gpus_of(flat)


class LearnedLimits:
    """The limits a study has learned so far; a candidate outside any of them is not launched."""

    def __init__(self, limits: Iterable[Limit] = ()):
        self.limits: list[Limit] = []
        for lim in limits:
            self.add(lim)

    def add(self, limit: Limit) -> bool:
        """True when the limit is new and tighter than what is known (a looser one teaches nothing)."""
        for i, old in enumerate(self.limits):
            if old.param == limit.param and old.op == limit.op and dict(old.when) == dict(limit.when):
                tighter = limit.value < old.value if limit.op == "<=" else limit.value > old.value
                if tighter:
                    self.limits[i] = limit
                return tighter
        self.limits.append(limit)
        return True

    def violation(self, params: Mapping[str, Any],
                  layouts: Mapping[str, Mapping[str, Any]] | None = None) -> Limit | None:
        for lim in self.limits:
            if any(params.get(k) != v for k, v in lim.when.items()):
                continue
            value = gpus_needed(params, layouts) if lim.param == GPUS else params.get(lim.param)
            if not lim.allows(value):
                return lim
        return None

    def __len__(self) -> int:
        return len(self.limits)

    def to_json(self) -> list[dict[str, Any]]:
        return [lim.to_json() for lim in self.limits]

    @classmethod
    def from_json(cls, docs: Iterable[Mapping[str, Any]] | None) -> "LearnedLimits":
        return cls(Limit.from_json(d) for d in (docs or []))
