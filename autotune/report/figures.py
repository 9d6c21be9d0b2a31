"""The report's plots, one function per figure, each returning a plotly Figure (or None when the study
holds nothing to plot). Every point carries its trial number in `customdata` and shows it on hover."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autotune.slo import SLO
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import is_feasible, pareto_front

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _layout(fig: go.Figure, title: str, simulated: bool, height: int = 420) -> go.Figure:
    label = " — SIMULATED" if simulated else ""
    fig.update_layout(title=title + label, height=height, template="plotly_white", margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def _hover(x: str, y: str) -> str:
    return f"trial %{{customdata}}<br>{x}: %{{x:.4g}}<br>{y}: %{{y:.4g}}<extra></extra>"


def pareto(study: StudyRecord, trials: Sequence[TrialRecord], exported: TrialRecord | None,
           simulated: bool) -> go.Figure | None:
    """The first two objectives: measured trials (feasible and not), the front, the baseline and the
    trial `export` picks. With one objective, that objective against the trial number."""
    names = [o for o, _ in study.objectives]
    rows = [t for t in trials if t.objectives and all(n in t.objectives for n in names)]
    if not rows:
        return None
    if len(names) >= 2:
        xn, yn = names[0], names[1]
        xy = lambda ts: ([t.objectives[xn] for t in ts], [t.objectives[yn] for t in ts])  # noqa: E731
    else:
        xn, yn = "trial", names[0]
        xy = lambda ts: ([t.number for t in ts], [t.objectives[yn] for t in ts])  # noqa: E731
    fig = go.Figure()
    groups = [("feasible", [t for t in rows if is_feasible(t)], dict(color="#1f77b4", size=9)),
              ("breaks a constraint", [t for t in rows if not is_feasible(t)],
               dict(color="#999999", size=9, symbol="x"))]
    for label, ts, marker in groups:
        if ts:
            x, y = xy(ts)
            fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=label, marker=marker,
                                     customdata=[t.number for t in ts], hovertemplate=_hover(xn, yn)))
    front = sorted(pareto_front(study, rows), key=lambda t: xy([t])[0][0])
    if front:
        x, y = xy(front)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name="Pareto front", line=dict(color="#2ca02c"),
                                 marker=dict(size=11, color="rgba(0,0,0,0)", line=dict(color="#2ca02c", width=2)),
                                 customdata=[t.number for t in front], hovertemplate=_hover(xn, yn)))
    for label, t, marker in (("baseline (vLLM defaults)", next((t for t in rows if t.role == "baseline"), None),
                              dict(symbol="diamond", size=14, color="#ff7f0e")),
                             ("exported", exported if exported in rows else None,
                              dict(symbol="star", size=18, color="#d62728"))):
        if t is not None:
            x, y = xy([t])
            fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=f"{label}: trial {t.number}", marker=marker,
                                     customdata=[t.number], hovertemplate=_hover(xn, yn)))
    fig.update_xaxes(title_text=xn)
    fig.update_yaxes(title_text=yn)
    fig.add_annotation(text=f"SLO {study.slo}: grey x = measured but broke it", showarrow=False,
                       xref="paper", yref="paper", x=1, y=1.08, xanchor="right")
    return _layout(fig, "Pareto front", simulated)


def history(study: StudyRecord, trials: Sequence[TrialRecord], simulated: bool) -> go.Figure | None:
    name, direction = study.objectives[0]
    rows = [t for t in trials if name in (t.objectives or {})]
    if not rows:
        return None
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[t.number for t in rows], y=[t.objectives[name] for t in rows], mode="markers",
                             name="measured", customdata=[t.number for t in rows],
                             marker=dict(color=["#1f77b4" if is_feasible(t) else "#999999" for t in rows]),
                             hovertemplate=_hover("trial", name)))
    best: list[tuple[int, float]] = []
    for t in rows:
        if is_feasible(t):
            v = t.objectives[name]
            if best and not (v > best[-1][1] if direction == "maximize" else v < best[-1][1]):
                v = best[-1][1]
            best.append((t.number, v))
    if best:
        fig.add_trace(go.Scatter(x=[b[0] for b in best], y=[b[1] for b in best], mode="lines", line_shape="hv",
                                 name="best feasible so far", customdata=[b[0] for b in best],
                                 hovertemplate=_hover("trial", name)))
    fig.update_xaxes(title_text="trial", tick0=0, dtick=max(1, math.ceil(len(trials) / 12)))   # whole trials
    fig.update_yaxes(title_text=name)
    return _layout(fig, f"Optimisation history ({name}; failed trials not shown)", simulated)


def importance(values: dict[str, dict[str, float]], note: str, simulated: bool) -> go.Figure | None:
    if not values:
        return None
    fig = go.Figure()
    for i, (objective, imp) in enumerate(values.items()):
        params = sorted(imp, key=imp.get)
        fig.add_trace(go.Bar(x=[imp[p] for p in params], y=params, orientation="h", name=objective,
                             marker_color=COLORS[i % len(COLORS)],
                             hovertemplate=f"{objective}<br>%{{y}}: %{{x:.3f}}<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="importance (PED-ANOVA, normalised)")
    return _layout(fig, f"Parameter importance {note}", simulated)


def _failure_label(t: TrialRecord) -> str | None:
    if t.state == "failed":
        return t.cause or "crash"
    if t.state == "infeasible":
        broken = [k for k, v in (t.constraints or {}).items() if v > 0]
        return t.cause or (", ".join(broken) if broken else "constraint")
    if t.state == "interrupted":
        return t.cause or "interrupted"
    return None


def failures(trials: Sequence[TrialRecord], simulated: bool) -> go.Figure | None:
    labelled = [(t, _failure_label(t)) for t in trials]
    by: dict[str, list[int]] = {}
    for t, label in labelled:
        if label:
            by.setdefault(label, []).append(t.number)
    if not by:
        return None
    counts = Counter({k: len(v) for k, v in by.items()})
    causes = [c for c, _ in counts.most_common()]
    fig = go.Figure(go.Bar(x=causes, y=[counts[c] for c in causes], marker_color="#d62728",
                           customdata=[", ".join(str(n) for n in by[c]) for c in causes],
                           hovertemplate="%{x}: %{y} trial(s)<br>trials %{customdata}<extra></extra>"))
    fig.update_yaxes(title_text="trials", dtick=1)
    return _layout(fig, "Trials that did not meet the bar, by cause", simulated, height=360)


def _slo_limits(study: StudyRecord) -> dict[str, float]:
    try:
        return {term.metric_key: term.limit_ms for term in SLO.parse(study.slo).terms}
    except Exception:
        return {}


def capacity_steps(study: StudyRecord, trials: Sequence[TrialRecord], simulated: bool) -> go.Figure | None:
    """Each measured trial's load steps: load against p99 TTFT and against output throughput."""
    rows = [t for t in trials if (t.capacity or {}).get("steps")]
    if not rows:
        return None
    mode = rows[0].capacity.get("mode", "load")   # type: ignore[union-attr]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("p99 TTFT per load step", "output tokens/s per load step"))
    for i, t in enumerate(rows):
        steps = sorted(t.capacity["steps"], key=lambda s: s.get("load") or 0)   # type: ignore[index]
        color = COLORS[i % len(COLORS)]
        x = [s.get("load") for s in steps]
        for col, key, label in ((1, "p99_ttft_ms", "p99 TTFT ms"), (2, "output_throughput", "output tok/s")):
            fig.add_trace(go.Scatter(
                x=x, y=[s.get(key) for s in steps], mode="lines+markers", name=f"trial {t.number}",
                legendgroup=str(t.number), showlegend=col == 1, line=dict(color=color),
                marker=dict(symbol=["circle" if s.get("slo_met") else "x" for s in steps]),
                customdata=[t.number] * len(steps), hovertemplate=_hover(mode, label)), row=1, col=col)
    limit = _slo_limits(study).get("p99_ttft_ms")
    if limit is not None:
        fig.add_hline(y=limit, line_dash="dash", line_color="#d62728", row=1, col=1,
                      annotation_text=f"SLO p99 TTFT {limit:g} ms")
    fig.update_xaxes(title_text=mode)
    fig.update_yaxes(title_text="p99 TTFT ms", row=1, col=1)
    fig.update_yaxes(title_text="output tok/s", row=1, col=2)
    return _layout(fig, "Capacity search steps (o met the SLO, x broke it)", simulated, height=460)


# GPU (nvml, sim) and CPU-build (cpu) series; a study shows the ones its telemetry source wrote
SERIES = (("power_w", "power W"), ("cpu_pct", "server CPU %"), ("mem_used_mib", "GPU memory used MiB"),
          ("rss_mib", "server memory MiB"), ("kv_usage_pct", "KV cache use %"))


def telemetry(series: dict[int, list[dict[str, Any]]], simulated: bool) -> go.Figure | None:
    """The telemetry series kept (the best trials only: the store keeps them bounded)."""
    present = [(k, label) for k, label in SERIES if any(k in s for rows in series.values() for s in rows)]
    if not present:
        return None
    fig = make_subplots(rows=1, cols=len(present), subplot_titles=[label for _, label in present])
    for i, (number, rows) in enumerate(sorted(series.items())):
        for col, (key, label) in enumerate(present, start=1):
            pts = [(s["t"], s[key]) for s in rows if key in s and s.get(key) is not None and "t" in s]
            if not pts:
                continue
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines",
                                     name=f"trial {number}", legendgroup=str(number), showlegend=col == 1,
                                     line=dict(color=COLORS[i % len(COLORS)]), customdata=[number] * len(pts),
                                     hovertemplate=_hover("t s", label)), row=1, col=col)
            fig.update_yaxes(title_text=label, row=1, col=col)
    fig.update_xaxes(title_text="seconds into the load")
    return _layout(fig, "Telemetry during the load (series kept for the best trials)", simulated, height=400)
