"""The confirmation and the verdict as lines a person reads: in `show` and at the head of every export."""

from __future__ import annotations

from typing import Sequence

from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.repository import ResultStore
from autotune.tuner.verdict import (Confirmed, ExportChoice, ObjectiveVerdict, objective_verdict,
                                    summarize_confirmations)

NOT_CONFIRMED = "not confirmed"


def _medians(study: StudyRecord, c: Confirmed) -> str:
    return ", ".join(f"{n} {c.medians[n]:.4g} (spread {c.spreads.get(n, 0.0):.1%})"
                     for n, _ in study.objectives if n in c.medians)


def cell(study: StudyRecord, c: Confirmed | None) -> str:
    """The `show` table's confirmed column: repeats, the first objective's median and spread."""
    if c is None:
        return "-"
    name = study.objectives[0][0]
    mark = "" if c.survives else " OUT"
    if name not in c.medians:
        return f"{len(c.rows)}x{mark}"
    return f"{len(c.rows)}x {c.medians[name]:.4g} ±{c.spreads.get(name, 0.0) / 2:.1%}{mark}"


def confirmation_lines(study: StudyRecord, trials: Sequence[TrialRecord], confirmed: dict[int, Confirmed]) -> list[str]:
    """Each confirmed configuration (medians, spread, whether it stays), then the verdict against the
    baseline, output-preserving and quality-changing winners apart when both exist."""
    if not confirmed:
        return ["not confirmed: every figure above is one run (`autotune confirm` measures the top candidates "
                "and the baseline again on fresh servers)"]
    lines = ["confirmed = median of repeats on fresh servers (full capacity search each, fresh prompts shared "
             "by the configurations of a round, order alternating by round); the objective columns stay each "
             "trial's first run, as Optuna saw it"]
    baseline = next((t for t in trials if t.role == "baseline"), None)
    for n, c in sorted(confirmed.items()):
        state = ("stays" if c.survives else f"pending: {c.why_not}" if c.pending
                 else f"leaves the front: {c.why_not}")
        flagged = sorted({f for r in c.rows for f in (r.measurement_flags or [])})
        if flagged:
            state += f"; repeats flagged {', '.join(flagged)}"
        lines.append(f"  #{n} ({c.trial.role}{', changes output quality' if c.quality_changing else ''}): "
                     f"{len(c.rows)} repeat(s): {_medians(study, c) or 'nothing measured'}; {state}")
    alive = [c for c in confirmed.values() if c.survives]
    base = confirmed.get(baseline.number) if baseline is not None else None
    base_measured = base is not None and any(r.state == "ok" for r in base.rows)
    if not alive:
        if any(c.pending for c in confirmed.values()):
            lines.append("CONFIRMATION NOT FINISHED: `autotune confirm` continues it")
            return lines
        lines.append("NOTHING SURVIVED CONFIRMATION: no configuration is exported")
        # the repeats still measured each candidate against the defaults in the same rounds: what they
        # say is worth reading even though no first run held (seen on the H200: FP8 beat the defaults in
        # every round while its first run had overstated its capacity)
        for n, c in sorted(confirmed.items()):
            if base_measured and c is not base and c.verdicts:
                lines.append(f"  measured in the paired rounds, not exported: #{n} against the baseline "
                             f"#{base.trial.number}: " + "; ".join(v.text() for v in c.verdicts))
        return lines
    if not base_measured:
        lines.append("no confirmed baseline: no verdict against vLLM's defaults")
        return lines
    if not base.survives:
        # its repeats still measured the defaults in the candidates' own rounds: the export's header states
        # this verdict, so `show` must not withhold it
        lines.append(f"the baseline #{base.trial.number} left the front ({base.why_not}); its repeats are "
                     "still the paired reference of the verdict")
    groups = {"output-preserving": [c for c in alive if c is not base and not c.quality_changing],
              "quality-changing": [c for c in alive if c.quality_changing]}
    name, direction = study.objectives[0]
    for label, group in groups.items():
        if not group:
            continue
        best = sorted(group, key=lambda c: -c.medians[name] if direction == "maximize" else c.medians[name])[0]
        kind = f"{label} " if all(groups.values()) or label == "quality-changing" else ""
        lines.append(f"best {kind}candidate #{best.trial.number} against the baseline #{base.trial.number}: "
                     + "; ".join(v.text() for v in best.verdicts))
    if not any(groups.values()):
        lines.append(f"only the baseline #{base.trial.number} survived: vLLM's defaults are the answer")
    lines.append("interval: 95 % Student t over the paired rounds' log ratios (candidate / baseline of the same "
                 "round); no gain beyond noise when it includes 1 or the gain is below one config's spread")
    return lines


def export_header(study: StudyRecord, trials: Sequence[TrialRecord], confirmed: dict[int, Confirmed],
                  choice: ExportChoice) -> list[str]:
    """The verdict for the exported trial, as comment lines (without the comment marker)."""
    t = choice.trial
    assert t is not None
    c = confirmed.get(t.number)
    if c is None or not c.survives:
        return [f"UNCONFIRMED: one run ({choice.why})"]
    out = [f"confirmed: {len(c.rows)} repeats on fresh servers: {_medians(study, c)}"]
    if c.verdicts:
        out.append("against the baseline: " + "; ".join(v.text() for v in c.verdicts))
    elif t.role == "baseline":
        out.append("this is the baseline: no candidate beat vLLM's defaults after confirmation")
    return out


# -- the same figures for the report, the diff and the deploy kit ------------------------------------------
def by_trial(store: ResultStore, study: StudyRecord, trials: Sequence[TrialRecord] | None = None
             ) -> dict[int, Confirmed]:
    """Trial number -> its confirmation (the same summary `show` and `export` use)."""
    trials = store.trials(study.id) if trials is None else trials
    return summarize_confirmations(study, trials, store.confirmations(study.id))


def verdict_line(trials: Sequence[TrialRecord], confirmed: dict[int, Confirmed], number: int) -> str:
    """Trial `number` against the baseline, in one line: the interval of every objective, or why there
    is no verdict."""
    c = confirmed.get(number)
    if c is None:
        return NOT_CONFIRMED
    baseline = next((t for t in trials if t.role == "baseline"), None)
    if baseline is not None and baseline.number == number:
        return "this is the baseline (vLLM's defaults)"
    if not c.survives:
        return f"{'pending' if c.pending else 'left the front'}: {c.why_not}"
    if not c.verdicts:
        return "no confirmed baseline: no verdict against vLLM's defaults"
    return "; ".join(v.text() for v in c.verdicts)


def repeat_values(c: Confirmed, objective: str) -> dict[int, float]:
    """Round -> the value a repeat of that round measured (failed repeats have none)."""
    return {r.round: float(r.objectives[objective]) for r in c.rows
            if r.state != "failed" and (r.objectives or {}).get(objective) is not None}


def gain(a: Confirmed | None, b: Confirmed | None, objective: str, direction: str) -> ObjectiveVerdict | None:
    """B against A on one objective, paired by round (the rounds share their prompts), with the same
    interval and noise rule as the verdict against the baseline."""
    if a is None or b is None:
        return None
    va, vb = repeat_values(a, objective), repeat_values(b, objective)
    pairs = [(va[r], vb[r]) for r in sorted(va.keys() & vb.keys())]
    return objective_verdict(objective, direction, pairs, list(va.values()), list(vb.values()))
