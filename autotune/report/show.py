"""`autotune show`: every trial with its state, cause and numbers, then the Pareto front. Failed trials
show their cause and no objective values (their placeholders stay inside Optuna)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import best_trial, is_feasible, pareto_front
from autotune.store.repository import ResultStore


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
    margin = ((study.spec or {}).get("telemetry") or {}).get("headroom_margin")
    return format_summary(t.telemetry, margin=margin)


def trial_rows(study: StudyRecord, trials: list[TrialRecord]) -> list[dict[str, Any]]:
    names = [o for o, _ in study.objectives]
    rows = []
    for t in trials:
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
        })
    return rows


def show_command(args: argparse.Namespace) -> int:
    store = ResultStore(args.storage, create=False)
    study = store.resolve_study(args.study_name)
    trials = store.trials(study.id)
    front = pareto_front(study, trials)
    best = best_trial(study, trials)
    rows = trial_rows(study, trials)
    profile = store.workload_profile(study.id)
    if args.json:
        print(json.dumps({"study": study.name, "model": study.model, "slo": study.slo,
                          "objectives": study.objectives, "workload_profile": profile, "trials": rows,
                          "pareto_front": [t.number for t in front],
                          "best": best.number if best else None}, indent=2, default=str))
        return 0
    console = Console(width=160)
    names = [o for o, _ in study.objectives]
    sim = " (SIMULATED engine)" if any(t.simulated for t in trials) else ""
    console.print(f"study [bold]{study.name}[/]{sim}: model {study.model}, SLO {study.slo}, "
                  f"{len(trials)} trial(s), storage {args.storage}")
    if profile:
        from autotune.bench.profile import format_profile
        console.print(format_profile(profile), markup=False, highlight=False)
    extra = [(label, key) for label, key, objective in (
        ("p99 TTFT ms", "p99_ttft_ms", "p99_ttft_ms"), ("p50 TPOT ms", "median_tpot_ms", "p50_tpot_ms"),
        ("out tok/s", "output_throughput", "output_tps")) if objective not in names
        and not (objective == "output_tps" and "capacity_tps" in names)]
    table = Table(show_lines=False)
    for col in ("#", "role", "state", "cause", "params", *names, *[e[0] for e in extra], "load", "KV tokens",
                "start s"):
        table.add_column(col, overflow="fold")
    for t, r in zip(trials, rows):
        table.add_row(str(t.number), t.role, t.state + (" *" if t in front else ""), t.cause or "",
                      compact_params(t), *[_fmt(r["objectives"].get(n)) for n in names],
                      *[_fmt(r[key]) for _, key in extra], _fmt(r["capacity"]), _fmt(t.kv_cache_tokens),
                      _fmt(t.startup_seconds))
    console.print(table)
    console.print("state * = on the Pareto front; load = highest load meeting the SLO (concurrency, req/s, or x a trace's recorded rate)")
    for t in trials:
        line = _telemetry_line(study, t)
        why = t.detail if (t.state != "ok" or t.cause) and t.detail else ""
        note = (t.capacity or {}).get("note") or ""
        if line or why or note:
            console.print(f"  trial {t.number}: " + "; ".join(x for x in (why, line, note) if x))
    if front:
        console.print("[bold]Pareto front[/] (feasible, non-dominated; * above): " + ", ".join(
            f"#{t.number} (" + ", ".join(f"{n}={_fmt(t.objectives[n])}" for n in names) + ")" for t in front))
    if best is not None:
        console.print(f"best on {names[0]}: trial {best.number}: {' '.join(best.flags) or '(defaults)'}")
    else:
        console.print("no feasible trial yet")
    return 0
