"""A search space: the tunable flags of one study, loaded from `search_spaces/*.yaml` or inline.

The space is narrowed to the host before the study starts (multi-GPU knobs need GPUs; knobs that
change output quality need the study's opt-in), and its fingerprint is what a resumed study must
match: a changed space under an existing study name is an error, not a silent new landscape.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import optuna
import yaml

from autotune.errors import UserError
from autotune.space.constraints import violations
from autotune.flags import flags_to_mapping, mapping_to_flags
from autotune.space.params import ParamSpec

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None


@dataclass
class SearchSpace:
    params: dict[str, ParamSpec]
    fixed_flags: list[str] = field(default_factory=list)
    source: str = "inline"
    # The model's own maximum length (space/model_len.py) for the known-constraint check; set for the
    # study's model before the search starts, not part of the fingerprint (it is the model's, not the space's).
    model_max_len: int | None = None

    @classmethod
    def load(cls, ref: str | Mapping[str, Any], base_dir: Path | None = None) -> "SearchSpace":
        """`ref`: a name in search_spaces/ (`default`, `cpu`), a path to a YAML file, or a mapping."""
        if isinstance(ref, Mapping):
            return cls.from_mapping(ref, "inline")
        candidates = [Path(ref)]
        if base_dir is not None:
            candidates.insert(0, base_dir / ref)
        candidates.append(SPACES_DIR / (ref if ref.endswith((".yaml", ".yml")) else f"{ref}.yaml"))
        for path in candidates:
            if path.is_file():
                return cls.from_mapping(_read_yaml(path), str(path))
        raise UserError(f"search space {ref!r} not found (a file, or one of: "
                        f"{', '.join(sorted(p.stem for p in SPACES_DIR.glob('*.yaml')))})")

    @classmethod
    def from_mapping(cls, raw: Any, source: str) -> "SearchSpace":
        if not isinstance(raw, Mapping) or not isinstance(raw.get("params"), Mapping) or not raw["params"]:
            raise UserError(f"search space {source}: needs a non-empty 'params' mapping")
        unknown = set(raw) - {"params", "fixed", "description"}
        if unknown:
            raise UserError(f"search space {source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        params = {str(n): ParamSpec.from_mapping(str(n), p) for n, p in raw["params"].items()}
        for p in params.values():
            for other in p.when:
                if other not in params:
                    raise UserError(f"search space {source}: {p.name} depends on unknown param {other!r}")
        fixed = raw.get("fixed") or {}
        if not isinstance(fixed, Mapping):
            raise UserError(f"search space {source}: 'fixed' must be a mapping of flag: value")
        return cls(params, mapping_to_flags(fixed), source)

    def narrowed(self, num_gpus: int, quality_opt_in: Sequence[str] | bool) -> "SearchSpace":
        """Drop what this host or study cannot search; restrict parallel sizes to the GPUs given."""
        keep: dict[str, ParamSpec] = {}
        for p in self.params.values():
            if p.requires_gpus > max(num_gpus, 1):
                continue
            if p.quality and not (quality_opt_in is True or
                                  (not isinstance(quality_opt_in, bool) and p.name in quality_opt_in)):
                continue
            if p.layouts:
                choices = tuple(c for c in p.choices if p.gpus_needed(c) <= max(num_gpus, 1))
                if len(choices) <= 1:
                    continue
                p = ParamSpec(**{**p.__dict__, "choices": choices,
                                 "layouts": {c: p.layouts[c] for c in choices}})
            elif p.name.endswith("_parallel_size") and p.kind == "categorical":
                choices = tuple(c for c in p.choices if int(c) <= max(num_gpus, 1))
                if len(choices) <= 1:
                    continue
                p = ParamSpec(**{**p.__dict__, "choices": choices})
            keep[p.name] = p
        for p in list(keep.values()):  # a conditional param whose parent was dropped goes too
            if any(parent not in keep for parent in p.when):
                del keep[p.name]
        return SearchSpace(keep, list(self.fixed_flags), self.source, self.model_max_len)

    @property
    def quality_params(self) -> list[str]:
        return [p.name for p in self.params.values() if p.quality]

    def fingerprint(self) -> str:
        canon = json.dumps({"params": [self.params[k].describe() for k in sorted(self.params)],
                            "fixed": self.fixed_flags}, sort_keys=True, default=str)
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def _active(self, p: ParamSpec, chosen: Mapping[str, Any]) -> bool:
        return all(chosen.get(parent) in allowed for parent, allowed in p.when.items())

    def _ordered(self) -> list[ParamSpec]:
        """Parents before the params conditional on them."""
        done: list[ParamSpec] = []
        pending = list(self.params.values())
        while pending:
            ready = [p for p in pending if all(q in {d.name for d in done} for q in p.when)]
            if not ready:
                raise UserError(f"search space {self.source}: conditional params form a cycle")
            done += ready
            pending = [p for p in pending if p not in ready]
        return done

    def suggest(self, trial: optuna.Trial, only: Sequence[str] | None = None) -> dict[str, Any]:
        """Sample the active params. `only` limits sampling to those names (the baseline samples only
        enqueued values, so it records exactly what it ran)."""
        chosen: dict[str, Any] = {}
        for p in self._ordered():
            if only is not None and p.name not in only:
                continue
            if self._active(p, chosen):
                chosen[p.name] = p.suggest(trial)
        return chosen

    def baseline_params(self) -> dict[str, Any]:
        """vLLM's own defaults where the space knows them (inactive conditionals left out)."""
        chosen: dict[str, Any] = {}
        for p in self._ordered():
            if p.default is not None and p.contains(p.default) and self._active(p, chosen):
                chosen[p.name] = p.default
        return chosen

    def render(self, params: Mapping[str, Any]) -> list[str]:
        out: list[str] = []
        for name, value in params.items():
            if name in self.params:
                out += self.params[name].render(value)
        return out

    def violations(self, params: Mapping[str, Any], fixed_flags: Sequence[str], num_gpus: int) -> list[str]:
        effective = {**flags_to_mapping(fixed_flags), **flags_to_mapping(self.render(params))}
        return violations(effective, num_gpus, self.model_max_len)

    def flag_names(self) -> list[str]:
        """Every flag the space can emit, both boolean forms included, for the `--help` check."""
        out: list[str] = []
        for p in self.params.values():
            if p.layouts:
                for layout in p.layouts.values():
                    out += [f for f in mapping_to_flags(layout) if f.startswith("--")]
                continue
            out.append(p.flag)
            if p.kind == "bool":
                out.append("--no-" + p.flag[2:])
        return sorted(set(out), key=out.index)
