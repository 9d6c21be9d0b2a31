"""`autotune show`: every trial with its state, cause and numbers, then the Pareto front. Failed trials
show their cause and no objective values (their placeholders stay inside Optuna)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune import causes
from autotune.node.pool import format_cpulist
from autotune.engine.phases import format_phases
from autotune.report.confirmed import cell, confirmation_lines, confirmation_to_run, pending_outlook
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import is_feasible, pareto_front
from autotune.store.repository import ResultStore
from autotune.store.urls import mask_url
from autotune.tuner.picks import left_out
from autotune.tuner.verdict import confirmed_front, flags_of, spread_rule, summarize_confirmations
from autotune.tuner.winner import export_choice
from autotune.tuner.narrowing import Limit


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


SHORT = {"gpu_memory_utilization": "gmu", "max_num_seqs": "seqs", "max_num_batched_tokens": "batched",
         "enable_chunked_prefill": "chunked", "enable_prefix_caching": "prefix", "tensor_parallel_size": "tp",
         "data_parallel_size": "dp", "pipeline_parallel_size": "pp", "enable_expert_parallel": "ep",
         "kv_cache_dtype": "kv", "quantization": "quant"}


def compact_params(t: TrialRecord) -> str:
    """What a trial ran, in a column a person can scan. The baseline ran vLLM's defaults plus any
    baseline flags, so its flags are shown rather than the defaults it is recorded under."""
    if t.role == "baseline":
        return "defaults" + (" " + " ".join(t.flags) if t.flags else "")
    return " ".join(f"{SHORT.get(k, k)}={_fmt(v)}" for k, v in (t.params or {}).items())


def _telemetry_line(study: StudyRecord, t: TrialRecord) -> str:
    if not t.telemetry:
        return ""
    from autotune.telemetry import format_summary
    from autotune.telemetry.summary import spec_margin
    return format_summary(t.telemetry, margin=spec_margin(study.spec))


def placement_line(t: TrialRecord) -> str:
    """Where a trial ran and beside which trials: concurrent trials disturb each other's numbers."""
    if not t.lease:
        return ""
    lease = t.lease
    where = f"GPUs {format_cpulist(lease['gpus'])}" if lease.get("gpus") else f"slots {format_cpulist(lease.get('slots') or [])}"
    text = f"ran on {t.host or lease.get('host')}, {where}, cores {format_cpulist(lease.get('cores') or [])}"
    if t.overlapped:
        text += f"; overlapped trial(s) {', '.join(map(str, t.overlapped))} (measurement flag overlapped)"
    return text


def _twin_cell(pred: Any, name: str) -> str:
    if pred is None or (pred.predicted or {}).get(name) is None:
        return ""
    rank = f"#{pred.rank} " if pred.rank is not None else ""
    return f"{rank}{_fmt(float(pred.predicted[name]))}"


def trial_rows(study: StudyRecord, trials: list[TrialRecord], predictions: dict[int, Any] | None = None
               ) -> list[dict[str, Any]]:
    names = [o for o, _ in study.objectives]
    predictions = predictions or {}
    rows = []
    for t in trials:
        pred = predictions.get(t.number)
        rows.append({
            "number": t.number, "role": t.role, "state": t.state, "feasible": is_feasible(t), "cause": t.cause,
            "detail": t.detail, "params": t.params, "flags": t.flags,
            "objectives": {n: t.objectives.get(n) for n in names} if t.objectives else {},
            "slo_margins": {k: v for k, v in (t.constraints or {}).items() if k.startswith("slo:")},
            "p99_ttft_ms": (t.metrics or {}).get("p99_ttft_ms"),
            "median_tpot_ms": (t.metrics or {}).get("median_tpot_ms"),
            "output_throughput": (t.metrics or {}).get("output_throughput"),
            "capacity": (t.capacity or {}).get("capacity"),
            "kv_cache_tokens": t.kv_cache_tokens, "startup_seconds": t.startup_seconds,
            "telemetry": t.telemetry, "simulated": t.simulated, "engine_version": t.engine_version,
            "host": t.host, "lease": t.lease, "overlapped": t.overlapped or [],
            "measurement_flags": flags_of(t), "bracket": (t.capacity or {}).get("bracket"),
            "bound": (t.capacity or {}).get("bound"), "startup_phases": (t.startup or {}).get("phases"),
            "twin": {"rank": pred.rank, "predicted": pred.predicted, "simulated": True} if pred else None,
            "env": t.env or {}, "notes": trial_notes(study, t),
            "spec_acceptance_pct": (t.metrics or {}).get("spec_acceptance_pct"),
        })
    return rows


def trial_notes(study: StudyRecord, t: TrialRecord) -> list[str]:
    """What the trial's settings mean beyond their values: env knobs set, warnings vLLM would not give
    (space/constraints.py `notes`), speculative decoding's acceptance."""
    from autotune.flags import flags_to_mapping
    from autotune.report.provenance import acceptance
    from autotune.space.constraints import notes

    out = [f"env {k}={v}" for k, v in (t.env or {}).items()]
    out += notes(flags_to_mapping([*(study.fixed_flags or []), *(t.flags or [])]))
    if acceptance(t):
        out.append("speculative decoding: " + acceptance(t))
    return out


def knob_lines(store: ResultStore, study: StudyRecord, trials: list[TrialRecord]) -> tuple[list[str], list[dict]]:
    """The per-knob effects section of `show` (report/effects.py) as lines, and as JSON."""
    from autotune.report.effects import NOTE, effect_rows, knob_effects
    from autotune.report.importance import param_importances

    imp, _ = param_importances(store.url, study, trials)
    effects = knob_effects(study, trials, imp)
    if not effects:
        return [], []
    names = [o for o, _ in study.objectives]
    lines = ["knob effects (" + ", ".join(f"{n}: {d}" for n, d in study.objectives) + "):"]
    for row in effect_rows(effects, names):
        parts = [f"{n} imp {row[2 + 2 * i]} {row[3 + 2 * i]}" for i, n in enumerate(names)]
        lines.append(f"  {row[0]} ({row[1]} trials): " + "; ".join(parts))
    return [*lines, "  " + NOTE], [e.to_json() for e in effects]


def twin_blind_spots(trials: list[TrialRecord]) -> list[str]:
    """Knobs the study's trials set that the twin does not model (perfmodel/knobs.py): its predictions
    say nothing about them. Read by parameter name (a flag knob is named after its flag; the parallel
    layout is a composite of modelled flags; an env knob is never modelled)."""
    from autotune.perfmodel.knobs import MODELLED

    names = dict.fromkeys(k for t in trials for k in (t.params or {}))
    return [k for k in names if k not in MODELLED and k != "parallel_layout"]


def show_command(args: argparse.Namespace) -> int:
    store = ResultStore(args.storage, create=False)
    study = store.resolve_study(args.study_name)
    trials = store.trials(study.id)
    rows_c = store.confirmations(study.id)
    confirmed = summarize_confirmations(study, trials, rows_c)
    choice = export_choice(study, trials, rows_c)
    # where the choice changes output quality, what `export --output-preserving` writes instead
    keeps = (export_choice(study, trials, rows_c, output_preserving=True)
             if choice.confirmed is not None and choice.confirmed.quality_changing else None)
    max_extra = int(((study.spec or {}).get("confirm") or {}).get("max_extra", 2))
    skipped, skipped_note = left_out(study, trials, rows_c, max_extra)
    to_run, joining = confirmation_to_run(study, trials, rows_c) if not confirmed or any(
        c.pending for c in confirmed.values()) else ("", set())
    skipped = [(t, why) for t, why in skipped if t.number not in joining]   # the next run repeats those
    # once confirmed, the front is the survivors' confirmed medians; before, the first runs'
    front = ([c.trial for c in confirmed_front(study, confirmed)] if confirmed else pareto_front(study, trials))
    predictions = store.predictions(study.id)
    limits = store.limits(study.id)
    rows = trial_rows(study, trials, predictions)
    profile = store.workload_profile(study.id)
    from autotune.report.provenance import speculative_label, speculative_used
    spec_label = speculative_label(study) if any(speculative_used(t) for t in trials) else None
    if args.json:
        print(json.dumps({"study": study.name, "model": study.model, "slo": study.slo,
                          "objectives": study.objectives, "workload_profile": profile,
                          "trials": rows, "learned_limits": limits,
                          "confirmations": {str(n): c.to_json() for n, c in sorted(confirmed.items())},
                          "spread_rule": spread_rule(study),
                          "pareto_front": [t.number for t in front], "pareto_front_confirmed": bool(confirmed),
                          "best": choice.trial.number if choice.trial else None,
                          "best_confirmed": choice.confirmed is not None, "best_why": choice.why,
                          "knob_effects": knob_lines(store, study, trials)[1],
                          "speculative_label": spec_label,
                          "twin_unmodelled": twin_blind_spots(trials) if predictions else [],
                          "best_notes": choice.notes,
                          "output_preserving": ({"best": keeps.trial.number if keeps.trial else None,
                                                 "why": keeps.why, "notes": keeps.notes} if keeps else None),
                          "confirmation_left_out": [{"trial": t.number, "why": why} for t, why in skipped],
                          "confirmation_left_out_note": skipped_note or None,
                          "confirmation_to_run": to_run or None,
                          "confirmation_outlook": [o.to_json() for o in pending_outlook(study, trials, confirmed)]},
                         indent=2, default=str))
        return 0
    console = Console(width=160)
    names = [o for o, _ in study.objectives]
    sim = " (SIMULATED engine)" if any(t.simulated for t in trials) else ""
    console.print(f"study [bold]{study.name}[/]{sim}: model {escape(study.model)}, SLO {escape(study.slo)}, "
                  f"{len(trials)} trial(s), storage {mask_url(args.storage)}")
    if profile:
        from autotune.bench.profile import format_profile
        console.print(format_profile(profile), markup=False, highlight=False)
    if spec_label:
        console.print(spec_label, markup=False, highlight=False)
    extra = [(label, key) for label, key, objective in (
        ("p99 TTFT ms", "p99_ttft_ms", "p99_ttft_ms"), ("p50 TPOT ms", "median_tpot_ms", "p50_tpot_ms"),
        ("out tok/s", "output_throughput", "output_tps")) if objective not in names
        and not (objective == "output_tps" and "capacity_tps" in names)]
    table = Table(show_lines=False)
    twin = [f"twin {names[0]}"] if predictions else []
    spec_col = ["spec acc %"] if spec_label is not None or any(r["spec_acceptance_pct"] is not None for r in rows) else []
    for col in ("#", "role", "state", "cause", "params", *names, *twin, *[e[0] for e in extra], *spec_col, "load",
                "KV tokens", "start s", f"confirmed {names[0]}", "flags"):
        table.add_column(col, overflow="fold")
    for t, r in zip(trials, rows):
        table.add_row(str(t.number), t.role, t.state + (" *" if t in front else ""), t.cause or "",
                      compact_params(t), *[_fmt(r["objectives"].get(n)) for n in names],
                      *([_twin_cell(predictions.get(t.number), names[0])] if predictions else []),
                      *[_fmt(r[key]) for _, key in extra],
                      *([_fmt(r["spec_acceptance_pct"])] if spec_col else []), _fmt(r["capacity"]), _fmt(t.kv_cache_tokens),
                      _fmt(t.startup_seconds), cell(study, confirmed.get(t.number)),
                      " ".join(r["measurement_flags"]))
    console.print(table)
    console.print("state * = on the Pareto front; load = highest load meeting the SLO (concurrency, req/s, or x a trace's recorded rate); "
                  "objective columns = each trial's first run; confirmed = median of repeats ±half their spread "
                  "(OUT: left the front); flags = measurement flags (never exported unconfirmed)"
                  + ("; twin = the simulator's rank among the candidates it ranked and its predicted value "
                     "(SIMULATED, beside the measurement)" if predictions else "")
                  + ("; the twin does not model " + ", ".join(twin_blind_spots(trials)) + " (their effect is "
                     "measured only)" if predictions and twin_blind_spots(trials) else ""),
                  markup=False, highlight=False)
    for t in trials:
        line = _telemetry_line(study, t)
        why = t.detail if (t.state != "ok" or t.cause) and t.detail else ""
        note = (t.capacity or {}).get("note") or ""
        placed = placement_line(t) if any(r.overlapped for r in trials) else ""
        phases = (t.startup or {}).get("phases")
        start = format_phases(phases) if phases else ""
        knobs = "; ".join(trial_notes(study, t))
        if line or why or note or placed or start or knobs:
            console.print(f"  trial {t.number}: " + "; ".join(x for x in (why, knobs, line, note, placed, start) if x),
                          markup=False, highlight=False)
    for line in confirmation_lines(study, trials, confirmed, skipped, skipped_note, to_run):
        console.print(line, markup=False, highlight=False)
    for lim in limits:
        console.print("[bold]learned limit[/]: " + Limit.from_json(lim).text())
    counts = {k: sum(1 for t in trials if pred(t)) for k, pred in (
        ("early-stopped", lambda t: t.cause == causes.EARLY_STOPPED), ("duplicate", lambda t: t.state == "duplicate"),
        ("constraint-rejected", lambda t: t.cause == causes.CONSTRAINT))}
    if any(counts.values()):
        console.print("not launched or stopped early: " + ", ".join(f"{v} {k}" for k, v in counts.items())
                      + " (candidates not launched, whether duplicates, outside a learned limit, breaking a known "
                        "constraint or predicted out of memory, do not count as trials)")
    for line in knob_lines(store, study, trials)[0]:
        console.print(line, markup=False, highlight=False)
    if front:
        values = {c.trial.number: c.medians for c in confirmed.values()} if confirmed else {}
        console.print(("[bold]Pareto front, confirmed medians[/]" if confirmed else
                       "[bold]Pareto front, first runs (unconfirmed)[/]") + " (feasible, non-dominated; * above): "
                      + ", ".join(f"#{t.number} (" + ", ".join(
                          f"{n}={_fmt(values.get(t.number, t.objectives)[n])}" for n in names) + ")" for t in front))
    for label, c in (("export", choice), ("export --output-preserving", keeps)):
        if c is None:
            continue
        if c.trial is not None:
            notes = "".join(f"; {n}" for n in c.notes)
            env = " ".join(f"{k}={v}" for k, v in (c.trial.env or {}).items())
            console.print(f"{label}: {c.why}{notes}: {' '.join(c.trial.flags) or '(defaults)'}"
                          + (f" with {env}" if env else ""), markup=False, highlight=False)
        else:
            console.print(f"{label}: nothing: {c.why}", markup=False, highlight=False)
    return 0
