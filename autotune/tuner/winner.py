"""The one choice of what is exported (every export format, `show`, the report and the deploy kit ask
this), decided by the confirmation's verdict once there is one.

Among the configurations that survived their repeats (tuner/verdict.py), the export is the best
confirmed median on the study's first objective whose paired verdict against the baseline on that
objective is not "worse" (beyond noise and in the bad direction); the baseline itself is one of them,
so when no candidate beats it the defaults are exported, with the verdict that says why. A candidate
within the noise floor of that median, as good by the verdict and with fewer flags, is exported in its
place, and the line says so (`_simplest_alike`). Where the study
opted into quality knobs, a configuration that changes output quality may win (its export says so and
names the knobs); `output_preserving` leaves those out. Nothing is exported only when the baseline did
not survive its own repeats and no candidate qualifies. Without confirmations, the best feasible trial
that carries no measurement flag, marked UNCONFIRMED: a flagged trial is never exported unconfirmed.

A winner chosen on the first objective may pay for it on the others: on the H200 chat study (an SLO on
TTFT only) the best first run had x1.26 the defaults' capacity at x5.6 their p50 TPOT. The line that
says why a trial is exported therefore also says what it costs on any other objective where it is worse
than the baseline: by the paired verdict when confirmed, by the first runs (beyond the noise floor) when not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.store.queries import best_trial
from autotune.telemetry.summary import spec_margin
from autotune.tuner.verdict import (NOISE_FLOOR, Confirmed, first_key, first_run_costs, flags_of,
                                    quality_changing, summarize_confirmations, worse_beyond_floor)


@dataclass
class ExportChoice:
    trial: TrialRecord | None
    confirmed: Confirmed | None      # None: exported on its first run (nothing confirmed, no flag)
    why: str                         # one line: why this trial, or why none
    notes: list[str] = field(default_factory=list)   # the verdict behind a baseline export: each candidate's


def export_choice(study: StudyRecord, trials: Sequence[TrialRecord], rows: Sequence[ConfirmationRecord],
                  output_preserving: bool = False) -> ExportChoice:
    """What `export` writes when no trial is named (see the module's docstring); `output_preserving`
    leaves out every configuration that changes output quality."""
    confirmed = summarize_confirmations(study, trials, rows)
    baseline = next((t for t in trials if t.role == "baseline"), None)
    if output_preserving:
        trials = [t for t in trials if not quality_changing(study, t, baseline)]
        confirmed = {n: c for n, c in confirmed.items() if not c.quality_changing}
    pending_note = ""
    if confirmed:
        pending = {n: c for n, c in confirmed.items() if c.pending}
        if not pending:
            return _by_verdict(study, confirmed, baseline, output_preserving)
        # a confirmation cut short (timeout, Ctrl-C) decides nothing yet: the first runs' rule applies,
        # without the trials a finished repeat already dropped
        reasons = "; ".join(f"trial {n}: {c.why_not}" for n, c in sorted(pending.items()))
        dropped = {n for n, c in confirmed.items() if not c.pending and not c.survives}
        trials = [t for t in trials if t.number not in dropped]
        pending_note = f"; confirmation not finished ({reasons}): `autotune confirm` continues it"
    clean = [t for t in trials if not flags_of(t)]
    best = best_trial(study, clean)
    overall = best_trial(study, list(trials))
    kind = "output-preserving " if output_preserving else ""
    if best is None:
        if overall is not None:
            return ExportChoice(None, None, f"the only feasible {kind}trials carry measurement flags (trial "
                                            f"{overall.number}: {', '.join(flags_of(overall))}) and none is "
                                            f"confirmed: run `autotune confirm`" + pending_note)
        return ExportChoice(None, None, f"no feasible {kind}trial in study {study.name!r} to export" + pending_note)
    why = f"trial {best.number}: best feasible {kind}trial on {study.objectives[0][0]}, UNCONFIRMED (first run only)"
    costs = first_run_costs(study, best, next((t for t in trials if t.role == "baseline"), None))
    why += f"; at a cost in its first run: {', '.join(costs)}" if costs else ""
    if overall is not None and overall is not best:
        why += (f"; trial {overall.number} measured better but carries {', '.join(flags_of(overall))} "
                f"and is not confirmed")
    return ExportChoice(best, None, why + pending_note)


def _by_verdict(study: StudyRecord, confirmed: dict[int, Confirmed], baseline: TrialRecord | None,
                output_preserving: bool) -> ExportChoice:
    name = study.objectives[0][0]
    base = confirmed.get(baseline.number) if baseline is not None else None
    candidates = sorted((c for c in confirmed.values() if c is not base), key=lambda c: c.trial.number)
    eligible = [c for c in candidates if c.survives and not _worse(c, name)]
    pool = eligible + ([base] if base is not None and base.survives else [])
    kind = "output-preserving " if output_preserving else ""
    if not pool:
        base_why = (f"the baseline #{base.trial.number} did not survive its repeats ({base.why_not})" if base is not None
                    else "the baseline was not measured in the confirmation (its first run was not feasible)")
        return ExportChoice(None, None, f"{base_why} and no {kind}candidate qualifies: "
                                        + ("; ".join(_standing(c, base, name) for c in candidates) or "none confirmed"))
    best = min(pool, key=lambda c: (first_key(study, c.medians), c is not base))   # a tie: the defaults
    top = best
    best, passed = _simplest_alike(study, top, eligible, name)
    if best is base:
        notes = ([f"no {kind}candidate beat it after confirmation: "
                  + "; ".join(_standing(c, base, name) for c in candidates)] if candidates
                 else [f"no {kind}candidate was confirmed beside it"])
        return ExportChoice(best.trial, best, f"trial {best.trial.number}: {baseline_words(best.trial)}, best "
                                              f"confirmed median on {name} over {len(best.rows)} repeats", notes)
    v = best.verdict(name)
    said = (f", {name} against the baseline: {'better' if v.better else 'no gain beyond noise'}"
            if v is not None and v.interval is not None else ", no paired verdict against the baseline")
    costs = [w.text() for w in best.verdicts if w.objective != name and w.worse]
    said += f"; at a cost: {'; '.join(costs)}" if costs else ""
    if best is not top:
        return ExportChoice(best.trial, best, f"trial {best.trial.number}: {kind}median on {name} over "
                                              f"{len(best.rows)} repeats within {NOISE_FLOOR:.0%} of the best "
                                              f"(#{top.trial.number}, x{_ratio(best, top, name):.3f}) with "
                                              f"{flag_count(best.trial)} flags against {flag_count(top.trial)}: "
                                              f"the simpler configuration{said}")
    said += f"; {passed}" if passed else ""
    return ExportChoice(best.trial, best, f"trial {best.trial.number}: best confirmed {kind}median on {name} over "
                                          f"{len(best.rows)} repeats{said}")


def flag_count(trial: TrialRecord) -> int:
    """How many vLLM options a trial sets beyond the fixed ones (`--x 1` and `--x=1` count once)."""
    return sum(1 for f in trial.flags or [] if f.startswith("--"))


def _ratio(c: Confirmed, top: Confirmed, name: str) -> float:
    return c.medians[name] / top.medians[name] if top.medians.get(name) else 1.0


def low_headroom_run(study: StudyRecord, c: Confirmed) -> str | None:
    """Which of its runs left less free memory at peak than the study's headroom margin (what `show`
    marks LOW HEADROOM), None if none did: a deploy closer to an out-of-memory error than the study
    asked for. Every run that measured memory counts, the first and the repeats."""
    margin, least = spec_margin(study.spec), c.least_headroom()
    if margin is None or least is None or least[0] >= margin:
        return None
    return least[1]


def _simplest_alike(study: StudyRecord, top: Confirmed, eligible: Sequence[Confirmed],
                    name: str) -> tuple[Confirmed, str]:
    """Among the candidates as good as `top` on the first objective, the one with the fewest flags, and
    (when none is) why each simpler one near it is not.

    Why: a median inside the noise floor of the best is not measurably worse, and every extra flag is
    one more thing to carry into a deploy, to break on an upgrade, and to explain. On the H100 decode
    study the best median (#4, eleven flags) was 0.5 % above #1 (two flags), both "better" against the
    defaults with the same interval to the third digit. "As good" means: the median within NOISE_FLOOR,
    the same verdict against the baseline on the first objective, no cost (a "worse" verdict on another
    objective) that `top` does not pay, no peak memory inside the study's headroom margin unless `top`'s
    was too (the H100 decode study's #1 peaked at 1.8 % free against a 3 % margin, #4 at 3.6 %: #4
    stays), and no quality knob changed unless `top` changes one too. Only candidates compete: the
    defaults still win only an exact tie (the verdict said no candidate beat them)."""
    if top not in eligible or name not in top.medians:
        return top, ""
    direction = study.objectives[0][1]      # `name` is the first objective

    def unlike(c: Confirmed) -> str | None:
        """None: as good; else why not ("" for no contender: as many flags, outside the floor, weaker)."""
        if c is top or name not in c.medians or flag_count(c.trial) >= flag_count(top.trial):
            return ""
        if worse_beyond_floor(_ratio(c, top, name), direction):
            return ""
        v, w = c.verdict(name), top.verdict(name)
        if (v is not None and v.better) != (w is not None and w.better):
            return ""
        top_costs = {x.objective for x in top.verdicts if x.worse}
        costs = [x.objective for x in c.verdicts if x.worse and x.objective not in top_costs]
        if costs:
            return f"it is worse on {', '.join(costs)}"
        if (run := low_headroom_run(study, c)) and not low_headroom_run(study, top):
            return f"its {run}'s peak memory left less than the {spec_margin(study.spec):.0%} headroom margin"
        if c.quality_changing and not top.quality_changing:
            return f"it changes output quality ({', '.join(c.quality)})"
        return None

    why_not = {c.trial.number: unlike(c) for c in eligible}
    alikes = [c for c in eligible if why_not[c.trial.number] is None]
    if alikes:
        return min(alikes, key=lambda c: (flag_count(c.trial), first_key(study, c.medians))), ""
    passed = "; ".join(f"#{n} sets fewer flags within {NOISE_FLOOR:.0%} of its median but {w}"
                       for n, w in sorted(why_not.items()) if w)
    return top, passed


def baseline_words(trial: TrialRecord) -> str:
    """How the baseline is named. A spec may give it flags of its own (a memory fraction the node can
    hold, or another study's winner measured as this one's baseline): then it is not "vLLM's defaults",
    and a reader told so would believe the defaults were measured (seen on the H200, 2026-12-02)."""
    if not trial.flags:
        return "the baseline (vLLM's defaults)"
    return f"the baseline (vLLM's defaults but {' '.join(trial.flags)})"


def _worse(c: Confirmed, name: str) -> bool:
    v = c.verdict(name)
    return v is not None and v.worse


def _standing(c: Confirmed, base: Confirmed | None, name: str) -> str:
    """One candidate against the baseline, in the words of the verdict: why it is not the export."""
    n = f"#{c.trial.number}"
    if not c.survives:
        return f"{n} left the front ({c.why_not})"
    v = c.verdict(name)
    if v is None or v.interval is None:
        return f"{n} has no paired verdict ({v.text() if v else 'no baseline rounds'})"
    if v.worse:
        return f"{n} is worse ({v.text()})"
    both = base is not None and name in base.medians and name in c.medians
    return f"{n}: {v.text()}" + (f"; its median {c.medians[name]:.4g} against the baseline's "
                                 f"{base.medians[name]:.4g}" if both else "")


def unconfirmed_flagged(trial: TrialRecord, rows: Sequence[ConfirmationRecord], study: StudyRecord,
                        trials: Sequence[TrialRecord]) -> str | None:
    """Why an explicitly named trial may not be exported (flagged and not a confirmed survivor), or None."""
    if not flags_of(trial):
        return None
    c = summarize_confirmations(study, trials, rows).get(trial.number)
    if c is not None and c.survives:
        return None
    return (f"trial {trial.number} carries {', '.join(flags_of(trial))} and is not confirmed"
            + (f" ({c.why_not})" if c is not None else "") + ": run `autotune confirm` first")
