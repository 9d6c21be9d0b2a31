"""One tunable vLLM knob: its range, how Optuna samples it and how it reaches the server: as a flag on
the command line, or (`env: NAME`) as a variable of the launch environment."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution,
                                  IntDistribution)

from autotune.errors import UserError
from autotune.flags import mapping_to_flags

_KINDS = ("int", "float", "bool", "categorical")
_KEYS = {"type", "low", "high", "step", "log", "choices", "default", "flag", "when", "quality",
         "requires_gpus", "help", "env", "opt_in", "json"}
# A categorical choice that means "leave the flag off" (e.g. quantization: none).
NONE_CHOICES = ("none", None)
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# Variables autotune sets on every launch itself (engine/vllm.py, tuner/trial.py, engine/cache.py): a knob
# may not take them over, or a trial would not run where it says it ran.
RESERVED_ENV = frozenset({"VLLM_SERVER_DEV_MODE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "VLLM_PORT",
                          "VLLM_DP_MASTER_PORT", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CACHE_ROOT",
                          "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYTHONPYCACHEPREFIX", "VLLM_API_KEY"})
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


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
    env: str = ""                # set as this environment variable of the launch, not as a flag
    opt_in: str = ""             # searched only when the study opts into this group (e.g. speculative)
    values: Mapping[str, Any] = field(default_factory=dict)   # label -> JSON value of the flag (`json: true`)

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
        env = _env_name(where, raw)
        opt_in = raw.get("opt_in") or ""
        if not isinstance(opt_in, str) or (opt_in and not re.fullmatch(r"[a-z][a-z0-9_]*", opt_in)):
            raise UserError(f"{where}: opt_in names a group of the study, like speculative, not {opt_in!r}")
        common = dict(name=name, kind=kind, default=raw.get("default"), flag=flag, when=when,
                      quality=bool(raw.get("quality", False)), requires_gpus=gpus, env=env, opt_in=opt_in)
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
            if raw.get("json"):
                # labelled JSON values of one flag (--speculative-config '{"method": "ngram", ...}'):
                # the sampler sees the labels, vLLM the JSON; a null value leaves the flag off
                if not isinstance(choices, Mapping) or not choices or env:
                    raise UserError(f"{where}: json: true needs choices mapping labels to JSON values (or "
                                    f"null for 'leave it off'), and a flag, not env")
                values = {str(k): v for k, v in choices.items()}
                try:
                    json.dumps(values)
                except (TypeError, ValueError):
                    raise UserError(f"{where}: a choice is not a JSON value") from None
                return cls(choices=tuple(values), values=values, **common)
            if isinstance(choices, Mapping) and choices:
                if env:
                    raise UserError(f"{where}: composite choices set flags; they cannot be an env knob")
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
        """Whether Optuna can record `value` for this knob as it is (a step's grid included: a value off
        it would be drawn again, not recorded)."""
        if self.kind in ("int", "float"):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high):
                return False
            dist = self.distribution()
            return bool(dist._contains(dist.to_internal_repr(value)))
        return value in self.choices

    def coerce(self, value: Any) -> Any:
        """`value` as this knob's own type where its text reads as one: a quoted YAML number ('0.94') for a
        number knob, a choice matched by its text ('true', '256') for the others. A baseline written so
        was launched as given but recorded as the space's default (seen on the H200, issue 25)."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if self.kind in ("int", "float"):
            try:
                number = float(text)
            except ValueError:
                return value
            return int(number) if self.kind == "int" and number.is_integer() else number
        matches = [c for c in self.choices if str(c).lower() == text.lower()]
        return matches[0] if len(matches) == 1 else value

    def render(self, value: Any) -> list[str]:
        """Command-line form. Booleans as --flag / --no-flag (vLLM's BooleanOptionalAction); an env knob
        has none (`render_env`)."""
        if self.env:
            return []
        if self.values:
            chosen = self.values.get(value)
            return [] if chosen is None else [self.flag, json.dumps(chosen, sort_keys=True, separators=(",", ":"))]
        if self.kind == "bool":
            return [self.flag] if value else ["--no-" + self.flag[2:]]
        if self.layouts:
            return mapping_to_flags(self.layouts[value])
        if self.kind == "categorical" and value in NONE_CHOICES:
            return []
        if self.kind == "float":
            return [self.flag, f"{float(value):g}"]
        return [self.flag, str(value)]

    def render_env(self, value: Any) -> dict[str, str]:
        """Environment form of an env knob: booleans as 1/0, a `none` choice leaves the variable unset."""
        if not self.env or (self.kind == "categorical" and value in NONE_CHOICES):
            return {}
        if isinstance(value, bool):
            return {self.env: "1" if value else "0"}
        return {self.env: f"{float(value):g}" if self.kind == "float" else str(value)}

    def knobs(self) -> list[str]:
        """What this parameter sets on the server, as the twin's tables name it (perfmodel/knobs.py):
        flag names with underscores, `env:NAME` for an environment variable; several for a composite."""
        if self.env:
            return [f"env:{self.env}"]
        if self.layouts:
            names = {str(k) for layout in self.layouts.values() for k in layout}
            return sorted(names) or [self.name]
        return [self.flag[2:].replace("-", "_")]

    def describe(self) -> dict[str, Any]:
        """Canonical form for the space's fingerprint."""
        return {"name": self.name, "kind": self.kind, "low": self.low, "high": self.high, "step": self.step,
                "log": self.log, "choices": list(self.choices), "flag": self.flag,
                "when": {k: list(v) for k, v in sorted(self.when.items())},
                **({"layouts": {k: dict(v) for k, v in self.layouts.items()}} if self.layouts else {}),
                **({"env": self.env} if self.env else {}), **({"opt_in": self.opt_in} if self.opt_in else {}),
                **({"values": dict(self.values)} if self.values else {})}

    def filled(self, settings: Mapping[str, Any]) -> "ParamSpec | None":
        """JSON choices with `{key}` placeholders filled from an opt-in's settings (a draft model's path);
        choices naming a setting the study did not give are dropped. None when at most one is left."""
        if not self.values:
            return self
        kept: dict[str, Any] = {}
        for label, value in self.values.items():
            text = json.dumps(value)
            missing = [k for k in _PLACEHOLDER.findall(text) if settings.get(k) in (None, "")]
            if missing:
                continue
            for key in _PLACEHOLDER.findall(text):
                text = text.replace("{" + key + "}", json.dumps(str(settings[key]))[1:-1])
            kept[label] = json.loads(text)
        if len(kept) <= 1:
            return None
        return ParamSpec(**{**self.__dict__, "choices": tuple(kept), "values": kept})

    def gpus_needed(self, value: Any) -> int:
        """GPUs a composite choice asks for (TP x PP x DP, times its instances for a PD layout); 1 for
        anything else."""
        from autotune.pdlayout import gpus_of

        return gpus_of(self.layouts.get(value, {}) if self.layouts else {})


def _env_name(where: str, raw: Mapping[str, Any]) -> str:
    """The variable an env knob sets: upper-case, not a secret's name (the DB and exports record knob
    values), not one autotune sets on every launch itself."""
    from autotune.redact import looks_secret   # noqa: PLC0415 - redact imports nothing of the space

    env = raw.get("env") or ""
    if not env:
        return ""
    if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
        raise UserError(f"{where}: env must be an environment variable name like VLLM_X, not {env!r}")
    if raw.get("flag"):
        raise UserError(f"{where}: a knob is either a flag or an env variable, not both")
    if looks_secret(env):
        raise UserError(f"{where}: env {env} names a secret; knob values are recorded and exported, secrets "
                        "belong in engine.env")
    if env in RESERVED_ENV:
        raise UserError(f"{where}: env {env} is set by autotune on every launch; it cannot be a knob")
    return env
