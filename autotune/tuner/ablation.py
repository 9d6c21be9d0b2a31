"""`autotune ablate`: which of a configuration's knobs carry its gain over the defaults, measured.

`show`'s knob effects are associations over the study's trials: the sampler moves several knobs at once,
so they cannot say which knob of a winner did the work. On the H100 decode study the leading candidate
set two flags (a stream interval of 8, a CUDA-graph capture size of 1024), and only a run of one without
the other could tell them apart. This builds that run as a study of its own, kept beside the original:
- the same engine, workload, SLO and objectives; a SQLite study's ablation gets a file of its own beside
  the study's, and a PostgreSQL study's goes into the same database;
- a space of only the trial's knobs, each at the baseline's value or the trial's;
- the baseline; the trial again, with its exact params; and, for each knob where the trial differs from
  the baseline, the baseline plus that knob alone (plus the knobs it depends on, where the baseline
  switches it off). The baseline is vLLM's defaults, or what the spec's `baseline:` sets.

Each runs once, then all of them and the baseline run in paired rounds on fresh servers
(tuner/confirm.py). So each knob's effect comes as an interval against the defaults of the same rounds,
beside the whole configuration's. Nothing is searched and no twin ranks. Early stopping is off, because
a variant stopped as dominated would get no repeats. The same command resumes the study."""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from autotune.errors import UserError
from autotune.space import SearchSpace
from autotune.spec import build_spec, load_spec_file
from autotune.store.models import TrialRecord
from autotune.store.repository import ResultStore, sqlite_path, storage_exists
from autotune.store.urls import mask_url

MAX_VARIANTS = 7     # with the trial itself, the confirmation's top_k limit (8)
_KEPT_KEYS = ("flag", "env", "quality", "requires_gpus", "opt_in")


@dataclass
class Ablation:
    """The derived study: its spec (`raw`, as a study file would hold it) and what each configuration is."""

    name: str
    trial: int                                   # the original study's trial number
    knobs: dict[str, tuple[Any, Any]]            # knob -> (the baseline's value, the trial's): those taken apart
    whole: dict[str, tuple[Any, Any]]            # the same for every knob where the trial differs
    variants: list[tuple[str, dict[str, Any]]]   # (label, enqueued params), one per knob
    raw: dict[str, Any]

    def plan_lines(self) -> list[str]:
        lines = [f"ablation {self.name}: the baseline, trial {self.trial} again, and {len(self.variants)} "
                 f"variant(s), each measured once and then in {self.raw['confirm']['repeats']} paired rounds "
                 f"on fresh servers; storage {mask_url(self.raw['storage'])}"]
        lines += [f"  {k}: {shown(b)} (baseline) -> {shown(v)} (trial {self.trial})" + ("" if k in self.knobs else
                  ", not taken apart (--knobs)") for k, (b, v) in self.whole.items()]
        lines += [f"  variant: the baseline plus {label}" for label, _ in self.variants]
        return lines


def shown(value: Any) -> str:
    """A knob's value as the plan and the labels say it: None (the engine's own default) as `default`, a
    float as its shortest form (a step grid's 0.15000000000000002 as 0.15)."""
    if value is None:
        return "default"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _value(space: SearchSpace, baseline: TrialRecord, name: str) -> Any:
    return baseline.params[name] if name in baseline.params else space.params[name].default


def differing(space: SearchSpace, baseline: TrialRecord, trial: TrialRecord) -> dict[str, tuple[Any, Any]]:
    """Knob -> (the baseline's value, the trial's), for the trial's params that differ from the baseline's
    (a param the baseline does not record counts at the space's default: what the server ran)."""
    unknown = sorted(set(trial.params) - set(space.params))
    if unknown:
        raise UserError(f"trial {trial.number} sets {unknown[0]}, which the study's search space no longer has")
    return {k: (_value(space, baseline, k), v) for k, v in trial.params.items() if v != _value(space, baseline, k)}


def _space_mapping(space: SearchSpace, baseline: TrialRecord, trial: TrialRecord, study: str,
                   also: Sequence[str] = ()) -> dict[str, Any]:
    """Every param the trial sets, narrowed to the baseline's value and the trial's (one where they agree).
    The trial is enqueued with its exact params, so it runs the flags it ran; and should a configuration
    be rejected before launch (a known constraint), the sampler's replacement stays among these values.
    Kinds keep their form on the command line: a bool stays --flag / --no-flag, a composite or JSON
    choice keeps its mapping, and a number becomes a choice of two numbers, rendered as the number was."""
    params: dict[str, Any] = {}
    values = {**{k: _value(space, baseline, k) for k in also}, **trial.params}
    for name, value in values.items():
        spec = space.params[name]
        base = _value(space, baseline, name)
        pair = [base] if base == value else [base, value]
        raw = space.raw_params.get(name) or {}
        entry = {k: raw[k] for k in (*_KEPT_KEYS, "json") if k in raw}
        if spec.kind == "bool":
            entry["type"] = "bool"
        elif spec.layouts or spec.values:
            labels = {str(v) for v in pair}
            entry.update(type="categorical", choices={k: v for k, v in raw["choices"].items() if str(k) in labels})
        else:
            entry.update(type="categorical", choices=pair)
        entry["default"] = base
        if spec.when and all(parent in values for parent in spec.when):
            entry["when"] = {parent: list(allowed) for parent, allowed in spec.when.items()}
        params[name] = entry
    return {"description": f"ablation of trial {trial.number} of {study}: each knob at the baseline's value "
                           f"or the trial's", "params": params}


def _variant(space: SearchSpace, baseline: TrialRecord, trial: TrialRecord, knob: str,
             start: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The baseline (`start`: what the spec's `baseline:` sets, else nothing) plus `knob` at the trial's
    value, and the trial's values of the parents the baseline would leave it switched off without (a
    value vLLM never receives measures nothing)."""
    params = {**start, knob: trial.params[knob]}
    for parent, allowed in space.params[knob].when.items():
        if _value(space, baseline, parent) not in allowed and parent in trial.params:
            params[parent] = trial.params[parent]
    label = f"{knob}={shown(trial.params[knob])}"
    extra = [f"{k}={shown(v)}" for k, v in params.items() if k != knob and k not in start]
    return (label + (f" (with {', '.join(extra)}, which it needs)" if extra else ""), params)


def build_ablation(raw: dict[str, Any], space: SearchSpace, study: str, storage: str, baseline: TrialRecord,
                   trial: TrialRecord, only: Sequence[str] | None = None, repeats: int | None = None) -> Ablation:
    """The derived study (see the module's docstring) for `trial` of `study`, whose spec is `raw` and whose
    storage is `storage`. A SQLite study's ablation gets a file of its own beside it, named for it: in the
    same file, every `show` or `export --storage` written for the study would then need --study-name."""
    if trial.role == "baseline":
        raise UserError(f"trial {trial.number} is the baseline: there is nothing to take apart")
    if trial.state != "ok":
        raise UserError(f"trial {trial.number} was not measured ({trial.state}): there is nothing to take apart")
    every = differing(space, baseline, trial)
    knobs = every
    if only:
        missing = [k for k in only if k not in every]
        if missing:
            raise UserError(f"--knobs: trial {trial.number} does not differ from the baseline in {missing[0]} "
                            f"(it does in: {', '.join(every) or 'nothing'})")
        knobs = {k: every[k] for k in only}
    whole = {k: v for k, (_, v) in every.items()}
    start = {k: baseline.params[k] for k in (raw.get("baseline") or {}) if k in baseline.params}
    variants = [_variant(space, baseline, trial, k, start) for k in knobs]
    variants = [(label, p) for label, p in variants if p != whole]    # the trial itself is measured anyway
    if not variants:
        raise UserError(f"trial {trial.number} differs from the baseline only in "
                        f"{', '.join(f'{k}={shown(v)}' for k, v in whole.items()) or 'nothing'}: its own "
                        f"confirmation is that knob's test (`autotune confirm`)")
    if len(variants) > MAX_VARIANTS:
        raise UserError(f"trial {trial.number} differs from the baseline in {len(variants)} knobs; take at most "
                        f"{MAX_VARIANTS} at a time with --knobs ({', '.join(knobs)})")
    name = f"{study}-ablate-{trial.number}"
    out = copy.deepcopy(raw)
    for key in ("budget", "warm_start", "early_stop", "confirm", "enqueue"):
        out.pop(key, None)
    out["name"] = name
    path = sqlite_path(storage)
    out["storage"] = f"sqlite:///{path.with_name(name + '.db')}" if path is not None else storage
    out["search_space"] = _space_mapping(space, baseline, trial, study, sorted(start))
    if space.fixed_flags:     # the original space's fixed flags, which the derived space does not carry
        engine = out.setdefault("engine", {})
        engine["extra_flags"] = [*(engine.get("extra_flags") or []), *space.fixed_flags]
    enqueue = [dict(trial.params)] + [p for _, p in variants]
    rounds = repeats if repeats is not None else int((raw.get("confirm") or {}).get("repeats", 3))
    out.update(enqueue=enqueue, budget={"n_trials": len(enqueue) + 1}, warm_start=False, early_stop=False,
               confirm={"enabled": True, "top_k": len(enqueue), "repeats": rounds, "max_extra": 0, "every": True})
    build_spec(out, name)      # a bad --repeats or a spec the original's schema no longer takes: one line here
    return Ablation(name, trial.number, knobs, every, variants, out)


def ablate_command(args: argparse.Namespace) -> int:
    """`autotune ablate --study FILE [--trial N] [--knobs a,b] [--repeats R] [--dry-run]`."""
    from autotune.tuner.command import prepare_spec, run_prepared
    from autotune.tuner.winner import export_choice

    started = time.monotonic()
    raw = load_spec_file(args.study)
    base_dir = Path(args.study).resolve().parent
    if args.storage:
        raw["storage"] = args.storage
    spec = build_spec(raw, args.study)
    name = args.study_name or spec.name
    if not storage_exists(spec.storage_url):
        raise UserError(f"no study storage at {mask_url(spec.storage_url)}: run the study first")
    store = ResultStore(spec.storage_url, create=False)
    study = store.study(name)
    if study is None:
        raise UserError(f"no study {name!r} in {mask_url(spec.storage_url)}")
    trials = store.trials(study.id)
    baseline = next((t for t in trials if t.role == "baseline" and t.state == "ok"), None)
    if baseline is None:
        raise UserError(f"study {name!r} has no measured baseline: an ablation measures knobs against it")
    if args.trial is not None:
        trial = next((t for t in trials if t.number == args.trial), None)
        if trial is None:
            raise UserError(f"study {name!r} has no trial {args.trial}")
    else:
        trial = export_choice(study, trials, store.confirmations(study.id)).trial
        if trial is None or trial.role == "baseline":
            raise UserError(f"study {name!r} exports {'nothing' if trial is None else 'the defaults'}: name the "
                            "trial to take apart with --trial N")
    space = SearchSpace.load(spec.search_space, base_dir)
    only = [k.strip() for k in args.knobs.split(",") if k.strip()] if args.knobs else None
    ablation = build_ablation(raw, space, name, spec.storage_url, baseline, trial, only, args.repeats)
    if storage_exists(ablation.raw["storage"]):
        earlier = ResultStore(ablation.raw["storage"], create=False)
        derived = earlier.study(ablation.name)
        if derived is not None:
            make_room(ablation, earlier.trials(derived.id))
    for line in ablation.plan_lines():
        print(line)
    if args.dry_run:
        return 0
    if args.timeout:
        ablation.raw["budget"]["timeout"] = args.timeout
    parts = prepare_spec(ablation.raw, args.study, base_dir)
    code = run_prepared(parts, no_progress=args.no_progress, started=started)
    for line in summary_lines(ResultStore(ablation.raw["storage"], create=False), ablation):
        print(line)
    return code


def make_room(ablation: Ablation, trials: Sequence[TrialRecord]) -> None:
    """A later call on the same trial with other `--knobs` resumes the same study: its budget counts the
    configurations earlier calls measured, so that this call's new variants still run (at `len(enqueue) +
    1` the study would hold enough trials already, and they would wait for ever)."""
    wanted = ablation.raw["enqueue"]
    others = [t for t in trials if t.role != "baseline" and t.state == "ok" and t.params not in wanted]
    ablation.raw["budget"]["n_trials"] = len(wanted) + 1 + len(others)


def summary_lines(store: ResultStore, ablation: Ablation) -> list[str]:
    """Each configuration's verdict against the defaults of the same rounds, under what it holds."""
    from autotune.report.confirmed import by_trial, verdict_line

    study = store.study(ablation.name)
    if study is None:
        return []
    trials = store.trials(study.id)
    confirmed = by_trial(store, study, trials)
    whole = ablation.raw["enqueue"][0]
    labelled = [(f"trial {ablation.trial} whole", whole)] + list(ablation.variants)
    out = [f"ablation {ablation.name} (`autotune show --storage {mask_url(ablation.raw['storage'])}`):"]
    for label, params in labelled:
        t = next((t for t in trials if t.role != "baseline" and t.params == params), None)
        said = verdict_line(trials, confirmed, t.number) if t is not None else "not run yet"
        out.append(f"  {label}: " + (f"#{t.number}: " if t is not None else "") + said)
    return out
