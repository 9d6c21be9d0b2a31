"""One tunable vLLM flag: its range, how Optuna samples it and how it is written on a command line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution,
                                  IntDistribution)

from autotune.errors import UserError
from autotune.flags import mapping_to_flags

_KINDS = ("int", "float", "bool", "categorical")
_KEYS = {"type", "low", "high", "step", "log", "choices", "default", "flag", "when", "quality",
         "requires_gpus", "help"}
# A categorical choice that means "leave the flag off" (e.g. quantization: none).
NONE_CHOICES = ("none", None)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    default: Any = None          # vLLM's own default, when known: what the baseline trial records
    flag: str = ""
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)   # active only when these params take these values
    quality: bool = False        # changes output quality: searched only with the study's opt-in
    requires_gpus: int = 1       # dropped from the space when fewer GPUs are given
    layouts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)   # label -> flags, for composite choices

    @classmethod
    def from_mapping(cls, name: str, raw: Any) -> "ParamSpec":
        where = f"search space param {name!r}"
        if not isinstance(raw, Mapping):
            raise UserError(f"{where}: expected a mapping like {{type: int, low: 1, high: 8}}")
        unknown = set(raw) - _KEYS
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        kind = raw.get("type")
        if kind not in _KINDS:
            raise UserError(f"{where}: type must be one of {', '.join(_KINDS)}")
        flag = raw.get("flag") or "--" + name.replace("_", "-")
        if not isinstance(flag, str) or not flag.startswith("--"):
            raise UserError(f"{where}: flag must be a --long-option, not {flag!r}")
        if not isinstance(raw.get("when") or {}, Mapping):
            raise UserError(f"{where}: when must map parameter names to allowed values")
        when = {str(k): tuple(v if isinstance(v, list) else [v]) for k, v in (raw.get("when") or {}).items()}
        gpus = raw.get("requires_gpus", 1)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            raise UserError(f"{where}: requires_gpus must be a whole number >= 1, not {gpus!r}")
        common = dict(name=name, kind=kind, default=raw.get("default"), flag=flag, when=when,
                      quality=bool(raw.get("quality", False)), requires_gpus=gpus)
        if kind in ("int", "float"):
            low, high = raw.get("low"), raw.get("high")
            if not _finite(low) or not _finite(high):
                raise UserError(f"{where}: {kind} needs numeric low and high")
            if low > high:
                raise UserError(f"{where}: low {low} is above high {high}")
            log, step = bool(raw.get("log", False)), raw.get("step")
            if log and low <= 0:
                raise UserError(f"{where}: a log range needs low > 0")
            if log and step not in (None, 1):
                raise UserError(f"{where}: log and step cannot be combined")
            if step is not None and (not _finite(step) or step <= 0):
                raise UserError(f"{where}: step must be a positive number")
            if kind == "int" and (int(low) != low or int(high) != high):
                raise UserError(f"{where}: int bounds must be whole numbers")
            return cls(low=low, high=high, step=step, log=log, **common)
        if kind == "categorical":
            choices = raw.get("choices")
            if isinstance(choices, Mapping) and choices:
                # composite choices: each label stands for several flags that only make sense together
                # (a parallel layout), so the sampler never proposes a combination no GPU count allows
                layouts = {str(k): dict(v or {}) for k, v in choices.items()}
                if not all(isinstance(v, Mapping) for v in choices.values() if v is not None):
                    raise UserError(f"{where}: each composite choice maps flag names to values")
                return cls(choices=tuple(layouts), layouts=layouts, **common)
            if not isinstance(choices, list) or not choices:
                raise UserError(f"{where}: categorical needs a non-empty list of choices (or a mapping "
                                f"of labels to flags)")
            return cls(choices=tuple(choices), **common)
        return cls(choices=(True, False), **common)

    def distribution(self) -> BaseDistribution:
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        if self.kind == "float":
            return FloatDistribution(float(self.low), float(self.high), log=self.log,
                                     step=None if self.step is None else float(self.step))
        return CategoricalDistribution(self.choices)

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1),
                                     log=self.log)
        if self.kind == "float":
            return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log,
                                       step=None if self.step is None else float(self.step))
        return trial.suggest_categorical(self.name, list(self.choices))

    def contains(self, value: Any) -> bool:
        if self.kind in ("int", "float"):
            return isinstance(value, (int, float)) and not isinstance(value, bool) \
                and self.low <= value <= self.high
        return value in self.choices

    def render(self, value: Any) -> list[str]:
        """Command-line form. Booleans as --flag / --no-flag (vLLM's BooleanOptionalAction)."""
        if self.kind == "bool":
            return [self.flag] if value else ["--no-" + self.flag[2:]]
        if self.layouts:
            return mapping_to_flags(self.layouts[value])
        if self.kind == "categorical" and value in NONE_CHOICES:
            return []
        if self.kind == "float":
            return [self.flag, f"{float(value):g}"]
        return [self.flag, str(value)]

    def describe(self) -> dict[str, Any]:
        """Canonical form for the space's fingerprint."""
        return {"name": self.name, "kind": self.kind, "low": self.low, "high": self.high, "step": self.step,
                "log": self.log, "choices": list(self.choices), "flag": self.flag,
                "when": {k: list(v) for k, v in sorted(self.when.items())},
                **({"layouts": {k: dict(v) for k, v in self.layouts.items()}} if self.layouts else {})}

    def gpus_needed(self, value: Any) -> int:
        """GPUs a composite choice asks for (TP x PP x DP); 1 for anything else."""
        layout = self.layouts.get(value, {}) if self.layouts else {}
        n = 1
        for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            n *= int(layout.get(key, 1))
        return n
