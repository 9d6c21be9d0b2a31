"""The confirmation and the verdict as lines a person reads: in `show` and at the head of every export."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from autotune.bench.metrics import capacity_tps
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.repository import ResultStore
from autotune.tuner.outlook import MAX_FACTOR, Outlook, baseline_median, outlook
from autotune.tuner.verdict import (MIN_ROUNDS, NOISE_FLOOR, OLD_SPREAD_RULE, SPREAD_RULES, Confirmed,
                                    ObjectiveVerdict, first_bracket, objective_verdict, relative_spread,
                                    spread_rule, summarize_confirmations)
from autotune.telemetry.summary import spec_margin
from autotune.tuner.winner import ExportChoice, baseline_words, low_headroom_run

NOT_CONFIRMED = "not confirmed"
SHOWN_LEFT_OUT = 5      # close or flagged trials the confirmation left out, named one a line in `show`
# A round's pair compares like with like only when it ran in one sitting: a round resumed later (a
# `--timeout`, a lost machine) pairs repeats hours or days apart, on another machine (the H200 long study:
# round 3's pair of #14 ran 36 h apart, and it is that candidate's one ratio above 1). Said, not dropped.
PAIR_APART_S = 3600.0


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


def _first_vs_median(study: StudyRecord, c: Confirmed) -> str:
    """The first run against the confirmed median on the first objective, and whether it held up."""
    name = study.objectives[0][0]
    first, med = c.first_run(name), c.medians.get(name)
    if first is None or med is None:
        return ""
    text = f"first run {first:.4g} -> median {med:.4g} (x{med / first:.3f})" if first else f"first run {first:.4g}"
    if c.reproduced(name) is False:
        text += (f": FIRST RUN NOT REPRODUCED (beyond the larger of the repeats' spread "
                 f"{c.spreads.get(name, 0.0):.1%} and {NOISE_FLOOR:.0%}), ranked by its median")
    return text


def load_text(c: Confirmed) -> str:
    """Where the SLO still held: the first run's bracket and each repeat's load, with their spread.
    Information only: the objectives decide (tuner/verdict.py)."""
    br = first_bracket(c.trial)
    cap = (c.trial.capacity or {}).get("capacity")      # a study stored before brackets were
    first = ((f"{br[0]:g}-{br[1]:g}" if br[1] is not None else f"{br[0]:g}+") if br
             else f"{cap:g}" if cap is not None else "-")
    loads = [x for x in c.loads() if x is not None]
    if not loads:
        return f"SLO held at load {first} in the first run"
    spread = f", spread {relative_spread(loads):.0%}" if len(loads) >= 2 else ""
    return (f"SLO held at load {first} in the first run, {' / '.join(f'{x:g}' for x in loads)} in the repeats "
            f"(median {statistics.median(loads):g}{spread})")


def met_steps(capacity: dict[str, Any] | None) -> list[tuple[float, float]]:
    """(load, steady output tok/s) of every step of a capacity search that met the SLO, in search order."""
    out = []
    for step in (capacity or {}).get("steps", []):
        tps = capacity_tps(step)       # the fully-loaded window where the step has one, as the objective
        if step.get("slo_met") and tps and step.get("load") is not None:
            out.append((float(step["load"]), float(tps)))
    return out


def peak_text(c: Confirmed) -> str:
    """Repeats whose throughput was higher at a lower load that also met the SLO, by more than the noise
    floor: the objective is read at the highest met load, the load the server can be given within the SLO,
    and a server that slows as streams are added (vLLM's defaults on the H100 decode study: 12,318 tok/s at
    128 streams, 10,649 at 216) is read at its lower figure. Said, so that a verdict is not read as the
    server's best throughput; `benchmarks/gpu/best_met_step.py` gives the verdict read the other way.
    Where, not why: one load step apart, the difference may be a step's own noise."""
    fell = []
    for r in c.rows:
        met = met_steps(r.capacity)
        if not met:
            continue
        cap = (r.capacity or {}).get("capacity")
        at = [x for x in met if x[0] == cap]
        top, best = (at[-1] if at else max(met)), max(met, key=lambda x: x[1])
        if best[1] > top[1] * (1.0 + NOISE_FLOOR):
            fell.append((best, top))
    if not fell:
        return ""
    best, top = max(fell, key=lambda bt: bt[0][1] / bt[1][1])
    return (f"output tok/s higher at a lower met load in {len(fell)} of {len(c.rows)} repeat(s) (at most "
            f"{best[1]:.4g} at load {best[0]:g} against {top[1]:.4g} at {top[0]:g}, the highest met load, where "
            f"it is read)")


def memory_text(study: StudyRecord, c: Confirmed) -> str:
    """The least free memory at peak over the first run and the repeats that measured it, and which run:
    the first run's line above is one server start, and a deploy lives with the worst of them. Said only
    where repeats measured memory (rows stored before they carried telemetry have none)."""
    least = c.least_headroom()
    if least is None or least[2] < 2:
        return ""
    free, which, runs = least
    low = f"; LOW HEADROOM, margin {spec_margin(study.spec):.0%}" if low_headroom_run(study, c) else ""
    return f"peak memory over {runs} runs: least free {100 * free:.1f}% ({which}{low})"


def pairs_apart(c: Confirmed, base: Confirmed) -> str:
    """The rounds whose candidate and baseline repeats started more than PAIR_APART_S apart, as a clause
    for the verdict's line ("" when every pair ran in one sitting)."""
    starts = {r.round: r.started_at for r in base.rows if r.started_at is not None}
    apart = []
    for r in sorted(c.rows, key=lambda r: r.round):
        b = starts.get(r.round)
        seconds = abs((r.started_at - b).total_seconds()) if r.started_at is not None and b is not None else 0.0
        if seconds > PAIR_APART_S:
            apart.append(f"round {r.round + 1} {seconds / 3600.0:.1f} h")
    if not apart:
        return ""
    return (f" (pairs run apart: {', '.join(apart)}; a round resumed later may pair another machine and "
            "hour, which the pairing is meant to rule out)")


def placement(rows: Sequence[Any]) -> str:
    """Where each repeat ran, by round: `r1 GPU 0, r2 GPU 1, r3 GPUs 2-3` (virtual slots on the CPU build
    and the simulator: `r1 slot 0`). Rounds run at the same time on different GPUs when slots are free."""
    from autotune.node.pool import format_cpulist

    out = []
    for r in sorted(rows, key=lambda r: r.round):
        lease = r.lease or {}
        gpus, slots = lease.get("gpus") or [], lease.get("slots") or []
        if gpus:
            out.append(f"r{r.round + 1} GPU{'s' if len(gpus) > 1 else ''} {format_cpulist(gpus)}")
        elif slots:
            out.append(f"r{r.round + 1} slot{'s' if len(slots) > 1 else ''} {format_cpulist(slots)}")
    return ", ".join(out)


def rounds_left_text(times: Sequence[tuple[int, int, float]]) -> str:
    """`round_times` as `show` says it; empty when a round has nothing to be timed by."""
    if not times or any(secs <= 0 for _, _, secs in times):
        return ""
    return (f"{sum(n for _, n, _ in times)} repeat(s) left: "
            + ", ".join(f"round {r + 1} ~{secs:.0f} s" for r, _, secs in times)
            + " (each configuration timed by its longest repeat so far, else its first run; a round runs whole)")


def planned_rounds(study: StudyRecord) -> int:
    """The paired rounds the study's own `confirm:` settings ask of each configuration."""
    return int(((study.spec or {}).get("confirm") or {}).get("repeats", MIN_ROUNDS))


def pending_outlook(study: StudyRecord, trials: Sequence[TrialRecord], confirmed: dict[int, Confirmed]) -> list[Outlook]:
    """While the confirmation is unfinished, what its rounds left can decide (tuner/outlook.py)."""
    baseline = next((t for t in trials if t.role == "baseline"), None)
    if baseline is None or not any(c.pending for c in confirmed.values()):
        return []
    return outlook(study, confirmed, baseline.number, planned_rounds(study))


def outlook_text(study: StudyRecord, confirmed: dict[int, Confirmed], baseline: TrialRecord | None) -> str:
    """`pending_outlook` as `show` says it (the caller knows the confirmation is unfinished), or empty."""
    seen = outlook(study, confirmed, baseline.number, planned_rounds(study)) if baseline is not None else []
    if not seen:
        return ""
    name, direction = study.objectives[0]
    b = baseline_median(study, confirmed[baseline.number])

    def who(o: Outlook) -> str:
        return f"#{o.trial} (so far {', '.join(f'x{r:.3f}' for r in o.so_far) or 'no paired round'})"

    can = [f"{who(o)} is better at x{o.needed:.3f} or {'more' if direction == 'maximize' else 'less'} in "
           + ("its 1 round left" if o.rounds_left == 1 else f"each of its {o.rounds_left} rounds left")
           for o in seen if o.needed is not None]
    cannot = [who(o) for o in seen if o.needed is None]
    bound = f"x{MAX_FACTOR:g}" if direction == "maximize" else f"x{1 / MAX_FACTOR:g}"
    said = can + ([f"{', '.join(cannot)} cannot be better at any ratio up to {bound}"] if cannot else [])
    return (f"what the rounds left can decide on {name}, said before they run (each candidate's rounds left "
            f"at one ratio to the baseline, the baseline's repeats at its median so far, {b:.4g}): "
            + "; ".join(said))


def confirmation_to_run(study: StudyRecord, trials: Sequence[TrialRecord],
                        rows: Sequence[Any]) -> tuple[str, set[int]]:
    """Which configurations the confirmation repeats (as `run` and `autotune confirm` pick them with the
    study's own `confirm:` settings) and how long each round still to run should take, said; and their
    trial numbers, which are not "left out" while it is unfinished, whatever the first pick was."""
    from autotune.tuner.confirm import configs_to_confirm, round_times, rounds_to_run
    from autotune.tuner.driver import expected_trial_s

    conf = (study.spec or {}).get("confirm") or {}
    baseline, picks = configs_to_confirm(study, trials, rows, top_k=int(conf.get("top_k", 2)),
                                         max_extra=int(conf.get("max_extra", 2)))
    configs = ([baseline] if baseline is not None else []) + list(picks.candidates)
    if not configs:
        return "", set()
    repeats = planned_rounds(study)
    said = rounds_left_text(round_times(configs, rows, repeats, expected_trial_s(trials) or 0.0))
    _, cut = rounds_to_run(configs, rows, repeats)
    cut_said = (f"round(s) {', '.join(str(r + 1) for r in cut)} cut in an earlier run, replaced (a round is not "
                f"finished by another run: its pairs would span two)" if cut else "")
    return ("to run: " + ", ".join(f"#{t.number}" for t in configs) + "".join(f"; {x}" for x in (said, cut_said) if x),
            {t.number for t in configs})


def confirmation_lines(study: StudyRecord, trials: Sequence[TrialRecord], confirmed: dict[int, Confirmed],
                       left_out: Sequence[tuple[TrialRecord, str]] = (), left_out_note: str = "",
                       to_run: str = "") -> list[str]:
    """Each confirmed configuration (medians, spread, first run against its median, the load at which
    the SLO held, whether it stays), each candidate's verdict against the baseline, the close or flagged
    trials the confirmation left out, and while it is unfinished what is left to run (`to_run`)."""
    if not confirmed:
        return ["not confirmed: every figure above is one run (`autotune confirm` measures the top candidates "
                "and the baseline again on fresh servers" + (f"; {to_run}" if to_run else "") + ")"]
    lines = ["confirmed = median of repeats on fresh servers (full capacity search each, fresh prompts shared "
             "by the configurations of a round, order alternating by round); the objective columns stay each "
             "trial's first run, as Optuna saw it; a configuration leaves the front only when a repeat fails or "
             "breaks the SLO at every load"]
    baseline = next((t for t in trials if t.role == "baseline"), None)
    for n, c in sorted(confirmed.items()):
        state = ("stays" if c.survives else f"pending: {c.why_not}" if c.pending
                 else f"leaves the front: {c.why_not}")
        flagged = sorted({f for r in c.rows for f in (r.measurement_flags or [])})
        if flagged:
            state += f"; repeats flagged {', '.join(flagged)}"
        quality = (", changes output quality: " + ", ".join(f"{k}={v}" for k, v in c.quality.items())
                   if c.quality else "")
        where = placement(c.rows)
        facts = "; ".join(x for x in (_medians(study, c) or "nothing measured", _first_vs_median(study, c),
                                      load_text(c), peak_text(c), memory_text(study, c), f"ran on {where}" if where else "") if x)
        lines.append(f"  #{n} ({c.trial.role}{quality}): {len(c.rows)} repeat(s): {facts}; {state}")
    for t, why in left_out[:SHOWN_LEFT_OUT]:
        lines.append(f"  #{t.number} left out of the confirmation: {why}")
    if left_out:
        more = len(left_out) - SHOWN_LEFT_OUT
        lines.append(f"  ({f'{more} more left out, listed by show --json; ' if more > 0 else ''}{left_out_note}; "
                     "`autotune confirm --extra N` repeats more)")
    if any(c.pending for c in confirmed.values()):
        lines.append("CONFIRMATION NOT FINISHED: `autotune confirm` continues it" + (f"; {to_run}" if to_run else ""))
        ahead = outlook_text(study, confirmed, baseline)
        return lines + ([ahead] if ahead else [])
    base = confirmed.get(baseline.number) if baseline is not None else None
    if base is None or not any(r.state == "ok" for r in base.rows):
        lines.append("no confirmed baseline: no verdict against vLLM's defaults")
        return lines
    if not base.survives:
        # its repeats that ran still measured the defaults in the candidates' own rounds
        lines.append(f"the baseline #{base.trial.number} left the front ({base.why_not}); its repeats that ran "
                     "are still the paired reference of the verdict")
    leaning, held = [], []
    for n, c in sorted(confirmed.items()):
        if c is not base and c.verdicts:
            lines.append(f"#{n} against the baseline #{base.trial.number}: " + "; ".join(v.text() for v in c.verdicts)
                         + pairs_apart(c, base))
            first = c.verdicts[0]
            if first.more_rounds_can_settle():
                leaning.append((n, first.interval.rounds))
            elif first.held_by_spread():
                held.append(n)
    objective, rule = study.objectives[0][0], spread_rule(study)
    if leaning:
        # --repeats counts the rounds each configuration has paired with the baseline (tuner/confirm.py)
        rounds = max(r for _, r in leaning)
        lines.append(f"{objective} of {', '.join(f'#{n}' for n, _ in leaning)} leaned the same way in every "
                     f"paired round, yet the interval includes 1: more rounds can settle it "
                     f"(`autotune confirm --repeats {rounds + 2}` adds 2); no gain is claimed until then")
    if held:
        lines.append(f"{objective} of {', '.join(f'#{n}' for n in held)} leaned one way, but the "
                     "difference is below the spread of one configuration's repeats: more rounds do not settle that "
                     + ("(max - min over repeats never narrows)" if rule == "range" else
                        "(the typical gap between two repeats does not shrink as repeats are added)")
                     + "; no gain is claimed")
    lines.append("interval: 95 % Student t over the paired rounds' log ratios (candidate / baseline of the same "
                 f"round); no gain beyond noise when it includes 1 or the gain is below one config's spread "
                 f"({SPREAD_RULES[rule][1]}, over their median)")
    return lines


def export_header(study: StudyRecord, trials: Sequence[TrialRecord], confirmed: dict[int, Confirmed],
                  choice: ExportChoice) -> list[str]:
    """The verdict for the exported trial, as comment lines (without the comment marker)."""
    t = choice.trial
    assert t is not None
    c = confirmed.get(t.number)
    if c is None:
        return [f"UNCONFIRMED: one run ({choice.why})"]
    if not c.survives:
        return [f"NOT CONFIRMED: {'pending' if c.pending else 'left the front'}: {c.why_not} ({choice.why})"]
    out = [f"chosen: {choice.why}", f"confirmed: {len(c.rows)} repeats on fresh servers: {_medians(study, c)}"]
    first = _first_vs_median(study, c)
    if first:
        out.append(first)
    if c.verdicts:
        base = next((x for x in confirmed.values() if x.trial.role == "baseline"), None)
        out.append("against the baseline: " + "; ".join(v.text() for v in c.verdicts)
                   + (pairs_apart(c, base) if base is not None else ""))
    if t.role == "baseline":
        out.append(f"this is {baseline_words(t)}" + (": " + "; ".join(choice.notes) if choice.notes else ""))
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
        return f"this is {baseline_words(baseline)}"
    if not c.survives:
        return f"{'pending' if c.pending else 'left the front'}: {c.why_not}"
    if not c.verdicts:
        return "no confirmed baseline: no verdict against vLLM's defaults"
    return "; ".join(v.text() for v in c.verdicts)


def repeat_values(c: Confirmed, objective: str) -> dict[int, float]:
    """Round -> the value a repeat of that round measured (failed repeats have none)."""
    return {r.round: float(r.objectives[objective]) for r in c.rows
            if r.state != "failed" and (r.objectives or {}).get(objective) is not None}


def gain(a: Confirmed | None, b: Confirmed | None, objective: str, direction: str,
         rule: str = OLD_SPREAD_RULE) -> ObjectiveVerdict | None:
    """B against A on one objective, paired by round (the rounds share their prompts), with the same
    interval and noise rule (the study's `spread_rule`) as the verdict against the baseline."""
    if a is None or b is None:
        return None
    va, vb = repeat_values(a, objective), repeat_values(b, objective)
    pairs = [(va[r], vb[r]) for r in sorted(va.keys() & vb.keys())]
    return objective_verdict(objective, direction, pairs, list(va.values()), list(vb.values()), rule)
