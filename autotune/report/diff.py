"""`autotune diff A B`: two trials (numbers, or `baseline`) side by side: the flags (and the environment
variables its env knobs set) each ran with, what each measured, B against A, and the confirmed gain with
its interval where both were confirmed."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune.errors import UserError
from autotune.flags import flags_to_mapping
from autotune.report import confirmed as conf
from autotune.report.show import _fmt
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import is_feasible
from autotune.store.repository import ResultStore
from autotune.tuner.verdict import spread_rule

MEASURES = (("p99 TTFT ms", "metrics", "p99_ttft_ms"), ("median TPOT ms", "metrics", "median_tpot_ms"),
            ("output tok/s", "metrics", "output_throughput"), ("load meeting the SLO", "capacity", "capacity"),
            ("mean power W", "telemetry", "mean_power_w"), ("peak memory MiB", "telemetry", "peak_mem_used_mib"),
            ("peak KV use %", "telemetry", "peak_kv_usage_pct"))


def pick_trial(trials: Sequence[TrialRecord], which: str) -> TrialRecord:
    if which == "baseline":
        found = next((t for t in trials if t.role == "baseline"), None)
        if found is None:
            raise UserError("the study has no baseline trial")
        return found
    try:
        number = int(which)
    except ValueError:
        raise UserError(f"{which!r}: give a trial number or 'baseline'") from None
    found = next((t for t in trials if t.number == number), None)
    if found is None:
        raise UserError(f"the study has no trial {number}")
    return found


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
        return float(b) / float(a)
    return None


def compare(study: StudyRecord, a: TrialRecord, b: TrialRecord, confirms: dict[int, conf.Confirmed]) -> dict[str, Any]:
    fa = flags_to_mapping([*study.fixed_flags, *a.flags])
    fb = flags_to_mapping([*study.fixed_flags, *b.flags])
    flags = [{"flag": k, "a": fa.get(k), "b": fb.get(k), "differs": fa.get(k) != fb.get(k)}
             for k in dict.fromkeys([*fa, *fb])]
    ea, eb = a.env or {}, b.env or {}   # what each trial's env knobs set in the launch environment
    flags += [{"flag": f"env {k}", "env": k, "a": ea.get(k), "b": eb.get(k), "differs": ea.get(k) != eb.get(k)}
              for k in dict.fromkeys([*ea, *eb])]
    rows = []
    for name, direction in study.objectives:
        va, vb = (a.objectives or {}).get(name), (b.objectives or {}).get(name)
        g = conf.gain(confirms.get(a.number), confirms.get(b.number), name, direction, spread_rule(study))
        rows.append({"measure": name, "direction": direction, "a": va, "b": vb, "ratio": _ratio(va, vb),
                     "confirmed_a": confirms[a.number].medians.get(name) if a.number in confirms else None,
                     "confirmed_b": confirms[b.number].medians.get(name) if b.number in confirms else None,
                     "confirmed_gain": None if g is None or g.interval is None else {
                         "ratio": g.interval.ratio, "low": g.interval.low, "high": g.interval.high,
                         "rounds": g.interval.rounds, "beyond_noise": g.beyond_noise, "text": g.text()}})
    for label, column, key in MEASURES:
        va, vb = (getattr(a, column) or {}).get(key), (getattr(b, column) or {}).get(key)
        if va is not None or vb is not None:
            rows.append({"measure": label, "a": va, "b": vb, "ratio": _ratio(va, vb)})
    for label, attr in (("KV-cache tokens", "kv_cache_tokens"), ("startup s", "startup_seconds")):
        va, vb = getattr(a, attr), getattr(b, attr)
        rows.append({"measure": label, "a": va, "b": vb, "ratio": _ratio(va, vb)})
    side = lambda t: {"number": t.number, "role": t.role, "state": t.state, "cause": t.cause,  # noqa: E731
                      "feasible": is_feasible(t), "simulated": t.simulated, "engine_version": t.engine_version}
    return {"study": study.name, "slo": study.slo, "a": side(a), "b": side(b), "flags": flags, "measures": rows}


def diff_command(args: argparse.Namespace) -> int:
    store = ResultStore(args.storage, create=False)
    study = store.resolve_study(args.study_name)
    trials = store.trials(study.id)
    a, b = pick_trial(trials, args.a), pick_trial(trials, args.b)
    out = compare(study, a, b, conf.by_trial(store, study))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    console = Console(width=140)
    sim = " (SIMULATED)" if a.simulated or b.simulated else ""
    console.print(f"study [bold]{study.name}[/]{sim}, SLO {escape(study.slo)}: trial {a.number} ({a.role}, {a.state}) "
                  f"against trial {b.number} ({b.role}, {b.state})")
    flags = Table(title="flags (* differs)")
    for col in ("flag", f"#{a.number}", f"#{b.number}"):
        flags.add_column(col)
    for f in out["flags"]:
        flags.add_row(("* " if f["differs"] else "  ") + f["flag"],
                      *[_fmt(f[k]) if f[k] is not None else ("(unset)" if "env" in f else "(vLLM default)")
                        for k in ("a", "b")])
    console.print(flags)
    table = Table(title="measurements (first runs; confirmed medians where confirmed)")
    for col in ("measure", f"#{a.number}", f"#{b.number}", "B/A", "confirmed A", "confirmed B", "confirmed gain"):
        table.add_column(col, overflow="fold")
    for r in out["measures"]:
        g = r.get("confirmed_gain")
        table.add_row(r["measure"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["ratio"]), _fmt(r.get("confirmed_a")),
                      _fmt(r.get("confirmed_b")), g["text"] if g else
                      (conf.NOT_CONFIRMED if "direction" in r else ""))
    console.print(table)
    return 0
