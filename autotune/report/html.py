"""`autotune report`: one self-contained HTML file (plotly's JavaScript embedded, no network needed)
with the trade-off, how the search went, why trials failed, the evidence behind each measurement, and
the trial `export` would deploy with its confirmed figures and verdict where they exist."""

from __future__ import annotations

import argparse
import datetime as dt
import html
from pathlib import Path
from typing import Any, Sequence

import plotly.graph_objects as go
import plotly.offline

from autotune.export.choice import exported_trial
from autotune.export.formats import quality_warning
from autotune.tuner.verdict import flags_of, quality_changes
from autotune.export.files import write_text_atomic
from autotune.report import confirmed as conf
from autotune.report import figures
from autotune.report.effects import NOTE as EFFECTS_NOTE, effect_rows, knob_effects
from autotune.report.importance import param_importances
from autotune.report.provenance import provenance_lines, speculative_label, speculative_used
from autotune.report.show import _fmt, compact_params
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import pareto_front
from autotune.store.repository import ResultStore

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;
padding:0 18px 40px;color:#222}
.sim{position:sticky;top:0;z-index:10;background:#b00020;color:#fff;text-align:center;font-weight:700;
padding:6px;letter-spacing:.08em}
@media print{.sim{position:fixed;left:0;right:0}}
h1{font-size:1.5em;margin:18px 0 4px} h2{font-size:1.15em;margin:26px 0 6px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top} th{background:#f4f4f4} .muted{color:#777} .warn{color:#b00020;font-weight:600}
.box{border:1px solid #ccc;border-radius:6px;padding:8px 12px;background:#fafafa}
code{font-size:.9em;word-break:break-all}
"""


def _e(v: Any) -> str:
    return html.escape(str(v))


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    return "\n".join(out + ["</table>"])


def _kv(mapping: dict[str, Any]) -> str:
    return ", ".join(f"{_e(k)}={_e(_fmt(v))}" for k, v in (mapping or {}).items()) or "-"


def _setting(study: StudyRecord, trials: Sequence[TrialRecord]) -> str:
    first = next((t for t in trials if t.engine_version), trials[0] if trials else None)
    spec = study.spec or {}
    rows = [("model", _e(study.model)), ("SLO", _e(study.slo)),
            ("objectives", _e(", ".join(f"{o} ({d})" for o, d in study.objectives))),
            ("engine", _e(f"{study.engine_kind}, version "
                          f"{(first.engine_version if first else None) or 'not recorded'}")),
            ("hardware", _kv(first.hardware) if first else "-"),
            ("workload", _kv(first.workload) if first else _kv(spec.get("workload") or {})),
            ("load", _kv(spec.get("load") or {})), ("sampler", _e(spec.get("sampler", "-"))),
            ("fixed flags", f"<code>{_e(' '.join(study.fixed_flags) or '-')}</code>"),
            ("trials", _e(", ".join(f"{n} {s}" for s, n in _states(trials).items())))]
    return _table(rows)


def _states(trials: Sequence[TrialRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in trials:
        out[t.state] = out.get(t.state, 0) + 1
    return out


def _confirmed_cell(study: StudyRecord, c: conf.Confirmed | None) -> str:
    if c is None:
        return f'<span class="muted">{conf.NOT_CONFIRMED}</span>'
    parts = []
    for name, _ in study.objectives:
        values = list(conf.repeat_values(c, name).values())
        if values:
            parts.append(f"{_e(name)} {c.medians[name]:.4g} [{min(values):.4g}, {max(values):.4g}]")
    failed = sum(1 for r in c.rows if r.state == "failed")
    state = "" if c.survives else f" ({'pending' if c.pending else 'left the front'})"
    return _e(f"{len(c.rows)} repeat(s)" + (f", {failed} failed" if failed else "") + state + ": ") + "; ".join(parts)


def _exported(study: StudyRecord, trials: Sequence[TrialRecord], choice: Any,
              confirms: dict[int, conf.Confirmed], flags: dict[int, list[str]]) -> str:
    t: TrialRecord | None = choice.trial
    if t is None:
        return f'<p class="warn">{_e(choice.reason)}</p>'
    baseline = next((b for b in trials if b.role == "baseline"), None)
    quality = quality_changes(study, t, baseline)
    memory = conf.memory_text(study, confirms[t.number]) if t.number in confirms else ""
    rows = [("trial", _e(f"{t.number} ({t.role}) - {choice.reason}")),
            ("flags", f"<code>{_e(' '.join([*study.fixed_flags, *t.flags]) or '(defaults)')}</code>"),
            ("first-run measurement", _kv(t.objectives) + (" (SIMULATED)" if t.simulated else "")),
            ("highest load meeting the SLO", _e(f"{_fmt((t.capacity or {}).get('capacity'))} "
                                                f"({(t.capacity or {}).get('mode', '-')})")),
            ("p99 TTFT ms / median TPOT ms", _e(f"{_fmt((t.metrics or {}).get('p99_ttft_ms'))} / "
                                                f"{_fmt((t.metrics or {}).get('median_tpot_ms'))}")),
            ("confirmed", _confirmed_cell(study, confirms.get(t.number))),
            *([("peak memory, every run", _e(memory))] if memory else []),
            ("verdict against the defaults", _e(conf.verdict_line(trials, confirms, t.number))),
            ("measurement flags", _e(", ".join(flags.get(t.number, [])) or "none recorded"))]
    if quality:
        rows.append(("quality warning", f'<span class="warn">{_e(quality_warning(quality))}</span>'))
    if t.env:
        rows.append(("environment (env knobs)", f"<code>{_e(' '.join(f'{k}={v}' for k, v in t.env.items()))}</code>"))
    for line in provenance_lines(study, t):
        rows.append(("speculative decoding", f'<span class="warn">{_e(line)}</span>'
                     if line.startswith("SPECULATIVE") else _e(line)))
    return _table(rows)


def _knob_effects(study: StudyRecord, trials: Sequence[TrialRecord], imp: dict[str, dict[str, float]]) -> str:
    """What each knob did to each objective (report/effects.py), with the trials it rests on."""
    effects = knob_effects(study, trials, imp)
    if not effects:
        return '<p class="muted">no knob moved among the measured trials yet</p>'
    names = [o for o, _ in study.objectives]
    head = ["knob", "measured trials", *[h for n in names for h in (f"{n}: importance", f"{n}: effect")]]
    return _table([[_e(c) for c in row] for row in effect_rows(effects, names)], head) + \
        f'<p class="muted">{_e(EFFECTS_NOTE)}</p>'



def _trial_table(study: StudyRecord, trials: Sequence[TrialRecord], front: set[int], exported: int | None,
                 confirms: dict[int, conf.Confirmed], flags: dict[int, list[str]]) -> str:
    names = [o for o, _ in study.objectives]
    rows = []
    for t in trials:
        mark = " ".join(m for m, on in (("front", t.number in front), ("exported", t.number == exported)) if on)
        rows.append([_e(t.number), _e(t.role), _e(t.state + (f" ({mark})" if mark else "")), _e(t.cause or ""),
                     f"<code>{_e(compact_params(t))}</code>",
                     *[_e(_fmt((t.objectives or {}).get(n))) for n in names],
                     _e(_fmt((t.metrics or {}).get("p99_ttft_ms"))), _e(_fmt((t.capacity or {}).get("capacity"))),
                     _e(_fmt(t.kv_cache_tokens)), _e(", ".join(flags.get(t.number, []))),
                     _confirmed_cell(study, confirms.get(t.number)), _e((t.detail or "")[:200])])
    head = ["#", "role", "state", "cause", "params", *names, "p99 TTFT ms", "load", "KV tokens", "measurement flags",
            "confirmed", "detail"]
    return _table(rows, head)


def _series(store: ResultStore, trials: Sequence[TrialRecord]) -> dict[int, list[dict[str, Any]]]:
    out = {}
    for t in trials:
        data = store.series(t.id, "telemetry")
        if data:
            out[t.number] = data
    return out


def render_report(store: ResultStore, study: StudyRecord) -> str:
    trials = store.trials(study.id)
    simulated = any(t.simulated for t in trials) or study.engine_kind == "sim"
    choice = exported_trial(study, trials, store.confirmations(study.id))
    confirms = conf.by_trial(store, study, trials)
    flags = {t.number: flags_of(t) for t in trials}
    front = {t.number for t in pareto_front(study, trials)}
    imp, imp_note = param_importances(store.url, study, trials)
    figs: list[tuple[str, str, go.Figure | None, str]] = [
        ("pareto", "Pareto front", figures.pareto(study, trials, choice.trial, simulated), "no measured trial yet"),
        ("history", "Optimisation history", figures.history(study, trials, simulated), "no measured trial yet"),
        ("importance", "Parameter importance", figures.importance(imp, f"({imp_note})", simulated), imp_note),
        ("failures", "Failures by cause", figures.failures(trials, simulated), "every trial met the bar"),
        ("steps", "Capacity search steps", figures.capacity_steps(study, trials, simulated),
         "no capacity search recorded"),
        ("telemetry", "Telemetry", figures.telemetry(_series(store, trials), simulated), "no telemetry series kept"),
    ]
    banner = ('<div class="sim">SIMULATED - these figures come from autotune\'s simulator, not from a real '
              "vLLM on real GPUs</div>") if simulated else ""
    body = [banner, f"<h1>autotune report: study {_e(study.name)}{' (SIMULATED)' if simulated else ''}</h1>",
            f'<p class="muted">written {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}; '
            "hover a point for its trial number. Figures are autotune's measurements (first runs; confirmed "
            "repeats where shown); failed trials carry no values here.</p>",
            "<h2>The setting</h2>", _setting(study, trials),
            "<h2>The trial export would deploy</h2>", _exported(study, trials, choice, confirms, flags)]
    for key, title, fig, empty in figs:
        body.append(f'<div id="fig-{key}">')
        if fig is None:
            body.append(f'<h2>{_e(title)}</h2><p class="muted">{_e(empty)}</p>')
        else:
            body.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{key}",
                                    config={"displaylogo": False, "responsive": True}))
        body.append("</div>")
    if any(speculative_used(t) for t in trials) and speculative_label(study):
        body.insert(3, f'<p class="warn">{_e(speculative_label(study))}</p>')
    body += ["<h2>What each knob did</h2>", _knob_effects(study, trials, imp)]
    body += ["<h2>Every trial</h2>", _trial_table(study, trials, front, choice.trial.number if choice.trial else None,
                                                  confirms, flags)]
    title = f"autotune report: {study.name}" + (" (SIMULATED)" if simulated else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{STYLE}</style>"
            f"<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_report(storage_url: str, study_name: str | None, path: str | Path) -> Path:
    """Render the study's report into `path` (write-then-rename). What `run --report` and the daemon call."""
    store = ResultStore(storage_url, create=False)
    study = store.resolve_study(study_name)
    return write_text_atomic(path, render_report(store, study))


def report_command(args: argparse.Namespace) -> int:
    out = write_report(args.storage, args.study_name, args.output)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, self-contained)")
    return 0


