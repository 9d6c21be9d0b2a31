"""A search space: the tunable flags of one study, loaded from `search_spaces/*.yaml` or inline.

The space is narrowed to the host before the study starts (multi-GPU knobs need GPUs; knobs that
change output quality, and opt-in groups such as speculative decoding, need the study's opt-in; flags
the engine's `--help` does not list are dropped), and its fingerprint is what a resumed study must
match: a changed space under an existing study name is an error, not a silent new landscape.

A space file may start from another (`extends: default`), replace some of its parameters (`params`)
and leave some out (`drop: [name, ...]`), so a study that must avoid one choice need not copy the rest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import optuna
import yaml

from autotune.errors import UserError
from autotune.space.constraints import needs_fixed, notes, violations
from autotune.flags import flags_to_mapping, mapping_to_flags, with_env
from autotune.pdlayout import KV_TRANSFER_FLAG, is_pd_flag
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
    raw_params: dict[str, Any] = field(default_factory=dict, repr=False)   # as written, for `extends`
    # A VLM's image facts for the multimodal constraints (space/multimodal.py), set like model_max_len.
    multimodal: Any = None

    @classmethod
    def load(cls, ref: str | Mapping[str, Any], base_dir: Path | None = None, _seen: tuple[str, ...] = ()
             ) -> "SearchSpace":
        """`ref`: a name in search_spaces/ (`default`, `cpu`), a path to a YAML file, or a mapping."""
        if isinstance(ref, Mapping):
            return cls.from_mapping(ref, "inline", base_dir, _seen)
        candidates = [Path(ref)]
        if base_dir is not None:
            candidates.insert(0, base_dir / ref)
        candidates.append(SPACES_DIR / (ref if ref.endswith((".yaml", ".yml")) else f"{ref}.yaml"))
        for path in candidates:
            if path.is_file():
                if str(path.resolve()) in _seen:
                    raise UserError(f"search space {path}: extends itself (a cycle of extends)")
                return cls.from_mapping(_read_yaml(path), str(path), path.resolve().parent,
                                        (*_seen, str(path.resolve())))
        raise UserError(f"search space {ref!r} not found (a file, or one of: "
                        f"{', '.join(sorted(p.stem for p in SPACES_DIR.glob('*.yaml')))})")

    @classmethod
    def from_mapping(cls, raw: Any, source: str, base_dir: Path | None = None,
                     _seen: tuple[str, ...] = ()) -> "SearchSpace":
        if isinstance(raw, Mapping) and raw.get("extends") is not None:
            raw = _extended(raw, source, base_dir, _seen)
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
        return cls(params, mapping_to_flags(fixed), source, raw_params={str(n): p for n, p in raw["params"].items()})

    def narrowed(self, num_gpus: int, quality_opt_in: Sequence[str] | bool,
                 opt_ins: Mapping[str, Mapping[str, Any]] | None = None) -> "SearchSpace":
        """Drop what this host or study cannot search; restrict parallel sizes to the GPUs given. A knob of
        an opt-in group (`opt_in: speculative`) stays only when `opt_ins` holds that group; its JSON
        choices get their `{placeholders}` from the group's settings (choices missing one are dropped)."""
        keep: dict[str, ParamSpec] = {}
        for p in self.params.values():
            if p.requires_gpus > max(num_gpus, 1):
                continue
            if p.quality and not (quality_opt_in is True or
                                  (not isinstance(quality_opt_in, bool) and p.name in quality_opt_in)):
                continue
            if p.opt_in:
                settings = (opt_ins or {}).get(p.opt_in)
                filled = p.filled(settings) if settings is not None else None
                if filled is None:
                    continue
                p = filled
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
        return SearchSpace(without_orphans(keep, self.params), list(self.fixed_flags), self.source, self.model_max_len,
                           multimodal=self.multimodal)

    def supported(self, unknown: Callable[[Sequence[str]], Sequence[str]]) -> tuple["SearchSpace", list[str]]:
        """The space without the flags this engine lacks, and one notice line per knob (or composite
        choice) dropped. `unknown` is the engine's `--help` check (engine.unknown_flags). Environment
        knobs are not flags and are kept; a conditional knob whose parent went goes with it. PD layout
        flags (`--pd-*`, pdlayout.py) are autotune's own: what the engine must know for them is
        `--kv-transfer-config`, which every instance of a split gets."""
        engine_unknown = unknown

        def unknown(flags: Sequence[str]) -> Sequence[str]:
            return engine_unknown(list(dict.fromkeys(KV_TRANSFER_FLAG if is_pd_flag(f) else f for f in flags)))

        keep: dict[str, ParamSpec] = {}
        notices: list[str] = []
        for p in self.params.values():
            if p.env:
                keep[p.name] = p
                continue
            if p.layouts:
                lacking = {c: list(unknown(_flag_list(p.layouts[c]))) for c in p.choices}
                choices = tuple(c for c in p.choices if not lacking[c])
                for c in p.choices:
                    if lacking[c]:
                        notices.append(f"the engine lacks {', '.join(lacking[c])} (not in its --help): {p.name} "
                                       f"choice {c} dropped, never sent")
                if len(choices) <= 1:
                    if len(choices) < len(p.choices):
                        notices.append(f"{p.name}: one choice or none left; knob dropped")
                    continue
                if len(choices) < len(p.choices):
                    p = ParamSpec(**{**p.__dict__, "choices": choices, "layouts": {c: p.layouts[c] for c in choices}})
                keep[p.name] = p
                continue
            lacking = list(unknown([p.flag, *(["--no-" + p.flag[2:]] if p.kind == "bool" else [])]))
            if lacking:
                notices.append(f"the engine lacks {', '.join(lacking)} (not in its --help): knob {p.name} "
                               "dropped, never sent")
                continue
            keep[p.name] = p
        kept = without_orphans(keep, self.params)
        notices += [f"knob {n} dropped with its parent" for n in keep if n not in kept]
        return SearchSpace(kept, list(self.fixed_flags), self.source, self.model_max_len,
                           multimodal=self.multimodal), notices

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
        enqueued values, so it records exactly what it ran). A param left out of `only` is not sent, so
        the server runs it at its default: that default, not its absence, decides whether a param that
        depends on it is active (an enqueued long-prefill threshold alone runs with chunked prefill on,
        vLLM's default, instead of vanishing into the engine's defaults)."""
        chosen: dict[str, Any] = {}
        seen: dict[str, Any] = {}
        for p, active in self._walk(only, seen):
            if active:
                chosen[p.name] = seen[p.name] = p.suggest(trial)
        return chosen

    def inactive(self, candidate: Mapping[str, Any]) -> list[str]:
        """Params of a given candidate that its other values (or the defaults of those it leaves out)
        switch off: such a value would never be sent, so an `enqueue:` holding one is refused."""
        seen: dict[str, Any] = {}
        off: list[str] = []
        for p, active in self._walk(candidate, seen):
            if active:
                seen[p.name] = candidate[p.name]
            else:
                off.append(f"{p.name} applies only when " + " and ".join(
                    f"{parent} is one of {list(allowed)}" for parent, allowed in p.when.items()))
        return off

    def _walk(self, given: Collection[str] | None, seen: dict[str, Any]) -> Iterator[tuple[ParamSpec, bool]]:
        """The `given` params (every one when None), parents first, each with whether it is active under
        `seen`: what the server runs with, where the caller records each given value and a param not
        given enters at its default (not sent, so the server runs that)."""
        for p in self._ordered():
            active = self._active(p, seen)
            if given is not None and p.name not in given:
                if active and p.default is not None:
                    seen[p.name] = p.default
                continue
            yield p, active

    def baseline_params(self) -> dict[str, Any]:
        """vLLM's own defaults where the space knows them (inactive conditionals left out)."""
        chosen: dict[str, Any] = {}
        for p in self._ordered():
            if p.default is not None and p.contains(p.default) and self._active(p, chosen):
                chosen[p.name] = p.default
        return chosen

    def launchable(self, fixed_flags: Sequence[str]) -> tuple["SearchSpace", list[str]]:
        """Without the knobs no candidate could launch under the study's fixed flags, with a notice each:
        dual-batch overlap without a DeepEP all2all backend (space/constraints.py `needs_fixed`)."""
        fixed = flags_to_mapping(fixed_flags)
        keep: dict[str, ParamSpec] = {}
        notices: list[str] = []
        for p in self.params.values():
            why = needs_fixed(p.knobs(), fixed)
            if why:
                notices.append(f"knob {p.name} dropped: {why}")
                continue
            keep[p.name] = p
        return SearchSpace(without_orphans(keep, self.params), list(self.fixed_flags), self.source,
                           self.model_max_len, multimodal=self.multimodal), notices

    def render(self, params: Mapping[str, Any]) -> list[str]:
        out: list[str] = []
        for name, value in params.items():
            if name in self.params:
                out += self.params[name].render(value)
        return out

    def render_env(self, params: Mapping[str, Any]) -> dict[str, str]:
        """The launch environment the candidate's env knobs set (empty when the space has none)."""
        out: dict[str, str] = {}
        for name, value in params.items():
            if name in self.params:
                out.update(self.params[name].render_env(value))
        return out

    def launch_key(self, params: Mapping[str, Any]) -> list[str]:
        """Flags and env knobs of a candidate as one list: what deduplication compares (tuner/dedupe.py)."""
        return with_env(self.render(params), self.render_env(params))

    def env_names(self) -> list[str]:
        return [p.env for p in self.params.values() if p.env]

    def violations(self, params: Mapping[str, Any], fixed_flags: Sequence[str], num_gpus: int) -> list[str]:
        effective = {**flags_to_mapping(fixed_flags), **flags_to_mapping(self.render(params))}
        return violations(effective, num_gpus, self.model_max_len, self.multimodal)

    def notes(self, params: Mapping[str, Any], fixed_flags: Sequence[str]) -> list[str]:
        """Warnings about a candidate vLLM accepts (space/constraints.py `notes`)."""
        return notes({**flags_to_mapping(fixed_flags), **flags_to_mapping(self.render(params))})

    def flag_names(self) -> list[str]:
        """Every flag the space can emit, both boolean forms included, for the `--help` check."""
        out: list[str] = []
        for p in self.params.values():
            if p.env:
                continue
            if p.layouts:
                for layout in p.layouts.values():
                    out += [f for f in mapping_to_flags(layout) if f.startswith("--") and not is_pd_flag(f)]
                continue
            if is_pd_flag(p.flag):
                continue
            out.append(p.flag)
            if p.kind == "bool":
                out.append("--no-" + p.flag[2:])
        return sorted(set(out), key=out.index)


def _flag_list(layout: Mapping[str, Any]) -> list[str]:
    return [f for f in mapping_to_flags(layout) if f.startswith("--")]


def without_orphans(params: dict[str, ParamSpec], every: Mapping[str, ParamSpec] | None = None) -> dict[str, ParamSpec]:
    """Settle the conditional params whose parent is gone. A parent that is not searched is left to vLLM,
    i.e. at its default (in `every`, the params before the cut): a child active at that default stays,
    without the condition (the memory fraction stays when the engine lacks --kv-cache-memory-bytes); any
    other child goes, as does one whose parent kept none of the values that activate it. Repeated, so a
    chain settles as a whole."""
    keep = dict(params)
    every = every or {}
    while True:
        changed = False
        for name, p in list(keep.items()):
            dead = [parent for parent, allowed in p.when.items() if parent in keep and keep[parent].choices
                    and not set(allowed) & set(keep[parent].choices)]
            if dead:   # the parent kept none of the values that activate it (a layout choice went)
                del keep[name]
                changed = True
                continue
            gone = [parent for parent in p.when if parent not in keep]
            if not gone:
                continue
            changed = True
            if all(parent in every and every[parent].default is not None and every[parent].default in p.when[parent]
                   for parent in gone):
                keep[name] = ParamSpec(**{**p.__dict__, "when": {k: v for k, v in p.when.items() if k not in gone}})
            else:
                del keep[name]
        if not changed:
            return keep


def _extended(raw: Mapping[str, Any], source: str, base_dir: Path | None, seen: tuple[str, ...]) -> dict[str, Any]:
    """`extends: NAME` resolved: the base's params, those in `params` replaced or added, those in `drop`
    left out; `fixed` and `description` from this file when it gives them."""
    unknown = set(raw) - {"extends", "params", "fixed", "description", "drop"}
    if unknown:
        raise UserError(f"search space {source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    if not isinstance(raw["extends"], str):
        raise UserError(f"search space {source}: extends names one space (default, cpu or a file)")
    base = SearchSpace.load(raw["extends"], base_dir, seen)
    own = raw.get("params") or {}
    drop = raw.get("drop") or []
    if not isinstance(own, Mapping) or not isinstance(drop, list):
        raise UserError(f"search space {source}: params is a mapping and drop a list of names")
    missing = [d for d in drop if d not in base.params]
    if missing:
        raise UserError(f"search space {source}: drop names {missing[0]!r}, which {raw['extends']} does not have")
    params: dict[str, Any] = {n: p for n, p in base.raw_params.items() if n not in drop}
    params.update({str(k): v for k, v in own.items()})
    # a base knob conditional on a dropped one: kept without the condition when the dropped knob's default
    # (what vLLM then runs) activates it, else dropped too (overridden knobs are the user's to state)
    settled = without_orphans({n: base.params[n] for n in params if n in base.params}, base.params)
    for name in [n for n in params if n in base.params and n not in own]:
        if name not in settled:        # conditional on a dropped knob at a value it never takes now
            del params[name]
        elif settled[name].when != base.params[name].when:   # a dropped parent, left at its default
            params[name] = {**params[name], "when": {k: list(v) for k, v in settled[name].when.items()}}
    fixed = raw.get("fixed") if raw.get("fixed") is not None else flags_to_mapping(base.fixed_flags)
    return {"params": params, "fixed": fixed, "description": raw.get("description", "")}
