"""Confirmation: before a study ends (and on `autotune confirm`), the top candidates (tuner/picks.py) and
the baseline are measured again on fresh servers, so that what gets exported is not one lucky run.

Each repeat is a whole trial through the same `TrialRunner` (same engine, flags, capacity search and
evidence), on a server started for it. Its capacity search also settles the first run's highest met load
(one more step when its bracket ends with that load inside), so the load `show` reports beside the
confirmed medians says whether the first run's load was met again, not how coarse a search ended (that
load is information; survival and the export go by the objectives, tuner/verdict.py). Round r draws its
prompts from its own seed, shared by every configuration of that round, so the per-round ratio
candidate / baseline compares like with like. The
order inside a round alternates (A B .. in even rounds, .. B A in odd ones): a machine that drifts
steadily slower then costs each side the same on average, which a fixed A-then-B order would not.

Repeats are rows of `autotune_confirmations`, linked to their trial; Optuna's values stay the first
run's. They count against `--timeout` but not against `--n-trials`. A round runs whole in one run: one
that the time left cannot hold is not started, and one cut anyway (an interrupt, a repeat that took longer
than expected, a measurement worker that died) is not finished by a later run, on another machine or
night, whose repeats would pair with this run's: a new round takes its place, and the cut round's repeats
count as repeats of their configurations, its pairs of one run as pairs.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from sqlalchemy.exc import IntegrityError

from autotune import causes
from autotune.node.pool import Lease
from autotune.spec import StudySpec
from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord, utcnow
from autotune.store.queries import is_feasible, wall_s
from autotune.store.repository import ResultStore
from autotune.telemetry.summary import summary_for_store
from autotune.tuner.objectives import measured_constraints, pick
from autotune.tuner.picks import Picks, pick_candidates
from autotune.tuner.trial import TrialOutcome, TrialRunner
from autotune.tuner.verdict import OLD_SPREAD_RULE, SPREAD_RULE, bracket_low, first_bracket

ROUND_SEED_BASE = 7_770_001    # fresh prompts: the first runs drew theirs from the spec's seed
ROUND_SEED_STRIDE = 104_729
SAID_LEFT_OUT = 5              # close or flagged trials named when the confirmation starts without them


def round_seed(spec_seed: int, r: int) -> int:
    return spec_seed + ROUND_SEED_BASE + ROUND_SEED_STRIDE * r


def plan(rounds: Sequence[tuple[int, Sequence[TrialRecord]]]) -> list[tuple[int, int, TrialRecord]]:
    """(round, position, trial) in the order they run: A B .. then .. B A, alternating by round."""
    out = []
    for r, configs in rounds:
        order = list(configs) if r % 2 == 0 else list(configs)[::-1]
        out += [(r, i, t) for i, t in enumerate(order)]
    return out


def rounds_to_run(configs: Sequence[TrialRecord], rows: Sequence[ConfirmationRecord],
                  repeats: int) -> tuple[list[tuple[int, list[TrialRecord]]], list[int]]:
    """(the rounds still to run, each with the configurations it holds in `configs`' order; the rounds cut
    in an earlier run before the baseline's repeat). Each configuration counts the rounds holding its row
    and the baseline's (the baseline its own rows; with no baseline, its own rows), since a pair is what
    the verdict weighs. A round number that holds any row belongs to the run that stored it and is never
    run again (its pairs would span two runs); new rounds take the first unused numbers, the k-th holding
    the baseline and every configuration still more than k rounds short of `repeats`. Counting per
    configuration, not per round, is what lets one join a confirmation under way (a wider noise circle
    once the baseline's repeats exist, tuner/picks.py; `--extra`) without voiding the rounds the others
    finished: counted per round, a newcomer made every earlier round look cut, and the H100 decode
    study's two whole rounds would have been run again."""
    base = next((t for t in configs if t.role == "baseline"), None)
    ids = {t.id for t in configs}
    held: dict[int, set[int]] = {}
    for x in rows:
        held.setdefault(x.round, set()).add(x.trial_id)
    pairs = {t.id: sum(1 for got in held.values() if t.id in got and (base is None or base.id in got))
             for t in configs}
    need = {i: max(0, repeats - n) for i, n in pairs.items()}
    cut = sorted(r for r, got in held.items() if base is not None and base.id not in got and got & ids)
    todo: list[tuple[int, list[TrialRecord]]] = []
    r = 0
    while len(todo) < max(need.values(), default=0):
        if r not in held:
            k = len(todo)
            todo.append((r, [t for t in configs if t is base or need[t.id] > k]))
        r += 1
    return todo, cut


@dataclass
class Round:
    """The repeats of one round still to run, in the round's order, and the seed they share. A round is
    one job of the scheduler: its pair stays on one lease (the paired comparison's meaning), different
    rounds may run at once on different GPUs."""

    number: int
    seed: int
    repeats: list[tuple[int, TrialRecord]]      # (position, trial)


@dataclass
class ConfirmResult:
    done: int          # repeats run by this call
    pending: int       # repeats still to run (timeout; a cut round counts whole: it runs again)
    stopped_by: str | None
    refused: bool = False   # not started: the whole round did not fit (a later, shorter one may)


def configs_to_confirm(study: StudyRecord, trials: Sequence[TrialRecord], rows: Sequence[ConfirmationRecord], *,
                       top_k: int, max_extra: int) -> tuple[TrialRecord | None, Picks]:
    """The feasible baseline and the picked candidates: what a confirmation repeats, and what `show` times
    before it runs. Read from the study's stored spec, `confirm.every` (an ablation's) picks them all."""
    baseline = next((t for t in trials if t.role == "baseline" and is_feasible(t)), None)
    every = bool(((study.spec or {}).get("confirm") or {}).get("every", False))
    return baseline, pick_candidates(study, trials, top_k, max_extra, rows, every=every)


def round_times(configs: Sequence[TrialRecord], rows: Sequence[ConfirmationRecord], repeats: int,
                fallback_s: float) -> list[tuple[int, int, float]]:
    """(round, repeats missing, expected seconds) of each round not finished, its repeats timed by
    `expected_repeat_s`: a round runs whole on one machine, so whoever splits the work into sessions needs
    each round's length, not the total."""
    todo, _ = rounds_to_run(configs, rows, repeats)
    return [(r, len(held), sum(expected_repeat_s(t, rows, fallback_s) for t in held)) for r, held in todo]


def plan_rounds(spec: StudySpec, store: ResultStore, study: StudyRecord, *, top_k: int, repeats: int,
                say: Callable[[str], None], max_extra: int = 0) -> list[Round]:
    """The rounds with repeats still missing, of the picked candidates (tuner/picks.py: `top_k`, then up to
    `max_extra` whose first run lies within the noise of the best or is flagged) and the baseline; whole
    rounds already stored are kept, and one cut in an earlier run is replaced by a new one
    (`rounds_to_run`). What was picked, and what was cut, is said."""
    trials = store.trials(study.id)
    rows = store.confirmations(study.id)
    baseline, picks = configs_to_confirm(study, trials, rows, top_k=top_k, max_extra=max_extra)
    candidates = picks.candidates
    if baseline is None and not candidates:
        say("confirmation: no feasible trial to confirm")
        return []
    configs = ([baseline] if baseline else []) + list(candidates)
    left, cut = rounds_to_run(configs, rows, repeats)
    todo = plan(left)
    names = ", ".join(f"#{t.number}" for t in configs)
    short = "".join(f"; round {r + 1} only {', '.join(f'#{t.number}' for t in held)}"
                    for r, held in left if len(held) < len(configs))
    say(f"confirmation: {names} x {repeats} rounds on fresh servers ({len(todo)} repeat(s) to run{short})")
    if cut:
        instead = (f"round(s) {', '.join(str(r + 1) for r, _ in left)} run instead" if left
                   else "later rounds replaced it")     # every replacement already ran: no empty list
        say(f"confirmation: round(s) {', '.join(str(r + 1) for r in cut)} cut in an earlier run, not finished "
            f"in this one (the pairs would span two runs): {instead}; a cut round's repeats still count as "
            f"repeats, its pairs of one run as pairs")
    if picks.costless:
        say(f"confirmation: {picks.costless}")
    if picks.extras:
        say(f"confirmation: beyond the top {top_k}, {', '.join(f'#{t.number}' for t in picks.extras)} joined: "
            f"first run within the noise of the best or flagged (noise {picks.noise:.1%}: {picks.noise_why})")
    if picks.left_out:
        more = len(picks.left_out) - SAID_LEFT_OUT
        say(f"confirmation: left out (confirm.max_extra = {max_extra}): "
            + "; ".join(f"#{t.number} ({why})" for t, why in picks.left_out[:SAID_LEFT_OUT])
            + (f"; {more} more (`autotune show` lists them)" if more > 0 else ""))
    rounds: dict[int, Round] = {}
    for r, i, t in todo:
        rounds.setdefault(r, Round(r, round_seed(spec.seed, r), [])).repeats.append((i, t))
    return list(rounds.values())


def rounds_said(rounds: Sequence[Round], repeats: int) -> int:
    """The N of "[confirm k/N]": `repeats`, or the last planned round's number when a cut round was
    replaced (rounds 3 and 4 of a 3-round confirmation whose round 2 was cut say 3/4 and 4/4)."""
    return max([repeats] + [r.number + 1 for r in rounds])


def run_round(spec: StudySpec, store: ResultStore, study: StudyRecord, runner: TrialRunner, rnd: Round, *,
              repeats: int, phase: Callable[[str], None], say: Callable[[str], None], deadline: float | None = None,
              expected_s: float = 0.0, lease: Lease | None = None, budget_s: float | None = None) -> ConfirmResult:
    """Run one round's missing repeats in order on fresh servers (with a `lease`: its GPUs, ports and
    cores, recorded on every row). A round none of whose repeats is stored yet is not started unless all
    of them fit before `deadline` (each as `expected_repeat_s` says, `expected_s` where nothing better is
    known; `stopped_by` "timeout"): a round is one paired comparison, and one cut by the deadline would be
    replaced by the next run (`rounds_to_run`), its time spent for no pair. That holds too when the
    invocation's whole time (`budget_s`) could never hold a round: it says so and the time a round needs,
    where it once ran the repeats one by one and left rounds whose pairs spanned two machines (the H100
    decode study's round 2). A repeat that would not finish before `deadline` is not started. A repeat
    whose measurement worker died measured nothing and is not stored: the round is cut. Interrupts
    propagate after the running server is stopped; the rows stored so far stay. Several processes may
    confirm one study (they share its storage): a repeat another one has stored since the plan is
    skipped, and one it stores while this one measures is kept (theirs), not an error."""
    done = 0
    rows = store.confirmations(study.id)
    takes = [expected_repeat_s(t, rows, expected_s) for _, t in rnd.repeats]
    if deadline is not None and sum(takes) > 0 and not begun(rnd, rows):
        need, left = sum(takes), deadline - time.monotonic()
        if left < need:
            whole = (f"; this run's whole time, {budget_s:.0f} s, can never hold this round: give it at least "
                     f"{need:.0f} s" if budget_s is not None and budget_s < need else "")
            say(f"[confirm {rnd.number + 1}/{repeats}] round not started: its {len(rnd.repeats)} repeat(s) take "
                f"~{need:.0f} s and {max(left, 0):.0f} s are left (a round runs whole, its pairs on one "
                f"machine{whole})")
            return ConfirmResult(0, len(rnd.repeats), "timeout", refused=True)
    for n, (pos, t) in enumerate(rnd.repeats):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or left < takes[n]:      # cut here, the next run runs a whole round again
                return ConfirmResult(done, len(rnd.repeats), "timeout")
        if _stored(store, study, t, rnd.number):
            continue
        say(f"[confirm {rnd.number + 1}/{repeats}] trial {t.number} ({t.role}), seed {rnd.seed}")
        started = utcnow()
        outcome = runner.run(t.number, t.flags, [], phase, lease=lease, seed=rnd.seed, env=t.env or {},
                             log_name=f"confirm-{t.number:04d}-r{rnd.number}.log", claim=bracket_low(t),
                             hint=first_bracket(t) if spec.load.search_start == "study" else None)
        if outcome.cause == causes.WORKER_DIED:
            say(f"[confirm {rnd.number + 1}/{repeats}] trial {t.number}: not stored ({outcome.detail}); "
                f"the round is cut, and the next run replaces it")
            continue
        row = _row(spec, outcome)
        if study.spread_rule is None:     # once stamped it never changes: no query per repeat after that
            study.spread_rule = store.stamp_spread_rule(study.id, SPREAD_RULE, OLD_SPREAD_RULE)
        try:
            store.save_confirmation(study_id=study.id, trial_id=t.id, round=rnd.number, position=pos,
                                    seed=rnd.seed, started_at=started, finished_at=utcnow(),
                                    lease=lease.to_json() if lease is not None else None, **row)
        except IntegrityError:
            if not _stored(store, study, t, rnd.number):
                raise
            say(f"[confirm {rnd.number + 1}/{repeats}] trial {t.number}: another process stored this repeat "
                f"meanwhile; its row is kept")
            continue
        done += 1
        shown = ", ".join(f"{k}={v:.4g}" for k, v in row["objectives"].items())
        say(f"[confirm {rnd.number + 1}/{repeats}] trial {t.number}: {row['state']}"
            + (f" ({row['cause']})" if row["cause"] else "") + (f": {shown}" if shown else ""))
    return ConfirmResult(done, 0, None)


def expected_repeat_s(trial: TrialRecord, rows: Sequence[ConfirmationRecord], fallback: float) -> float:
    """How long one repeat of `trial` should take: the longest of its repeats stored so far, else its own
    first run's wall, else `fallback` (the study's median trial). Per trial because the picked configurations
    are the study's largest, with more streams and longer capacity searches than its median trial: on the
    H100 decode study a round of four took 956 s where four median trials (190 s) said 759 s. The longest,
    not the median, because the two errors cost unlike amounts: a round refused hands its time to the next
    study of the chain, while a round begun and cut loses every repeat's pairing. That study's next three
    rounds took 956, 976 and 947 s where the sum of each configuration's median repeat said 901 s."""
    walls = [w for r in rows if r.trial_id == trial.id and r.state != "failed" and (w := wall_s(r))]
    if walls:
        return max(walls)
    own = wall_s(trial) if trial.state == "ok" else None
    return own if own else fallback


def begun(rnd: Round, rows: Sequence[ConfirmationRecord]) -> bool:
    """Some repeat of the round is stored (by this run or another process): it is finished repeat by
    repeat, not held back for its whole time."""
    ids = {t.id for _, t in rnd.repeats}
    return any(r.round == rnd.number and r.trial_id in ids for r in rows)


def round_need_s(rnd: Round, rows: Sequence[ConfirmationRecord], fallback: float) -> float:
    """fsum: the same repeats in another round's order give the same figure to the last bit, so a round
    is compared with one already refused by its times, not by its order."""
    return math.fsum(expected_repeat_s(t, rows, fallback) for _, t in rnd.repeats)


class Refusals:
    """The rounds a deadline refused, so that a later, shorter round still runs in the time left.

    Why: rounds are independent paired comparisons, each with its own seed, so their order carries no
    meaning, and an invocation that stopped at the first round too long for its time left the rest of
    it idle. The H100 chat study after its round 1: rounds 2 and 3 of all five configurations (~666 s
    each), round 4 of the baseline and #3 alone (~264 s); with ~600 s left, round 4 runs. A round no
    shorter than one already refused cannot fit (time only shrinks) and is passed over without a line."""

    def __init__(self) -> None:
        self.rounds: list[Round] = []
        self._least: float | None = None

    def add(self, rnd: Round, need_s: float | None = None) -> None:
        """A round left for a later run; `need_s`: the time it was refused for (None: passed over)."""
        self.rounds.append(rnd)
        if need_s is not None:
            self._least = need_s if self._least is None else min(self._least, need_s)

    def hopeless(self, rnd: Round, rows: Sequence[ConfirmationRecord], fallback: float) -> bool:
        return (self._least is not None and not begun(rnd, rows)
                and round_need_s(rnd, rows, fallback) >= self._least)

    def pending(self) -> int:
        return sum(len(r.repeats) for r in self.rounds)


def _stored(store: ResultStore, study: StudyRecord, trial: TrialRecord, round_: int) -> bool:
    return any(r.trial_id == trial.id and r.round == round_ for r in store.confirmations(study.id))


def stopped_line(left: int) -> str:
    return (f"confirmation stopped by the timeout: {left} repeat(s) left "
            f"(`autotune confirm` or the same run command continues; `autotune show` says what they can still decide)")


def confirm_study(spec: StudySpec, store: ResultStore, study: StudyRecord, runner: TrialRunner, *,
                  top_k: int, repeats: int, phase: Callable[[str], None], say: Callable[[str], None],
                  deadline: float | None = None, expected_s: float = 0.0, lease: Lease | None = None,
                  max_extra: int = 0, budget_s: float | None = None) -> ConfirmResult:
    """Run the missing repeats round after round on one lease (`autotune confirm`; `run` and the daemon
    hand the rounds to the scheduler as jobs instead, tuner/after_budget.py). Interrupts propagate after
    the running server is stopped."""
    rounds = plan_rounds(spec, store, study, top_k=top_k, repeats=repeats, say=say, max_extra=max_extra)
    done, refused = 0, Refusals()
    for k, rnd in enumerate(rounds):
        if refused.hopeless(rnd, store.confirmations(study.id), expected_s):
            refused.add(rnd)
            continue
        result = run_round(spec, store, study, runner, rnd, repeats=rounds_said(rounds, repeats), phase=phase, say=say,
                           deadline=deadline, expected_s=expected_s, lease=lease, budget_s=budget_s)
        done += result.done
        if result.refused:
            refused.add(rnd, round_need_s(rnd, store.confirmations(study.id), expected_s))
            continue
        if result.stopped_by is not None:
            left = result.pending + refused.pending() + sum(len(r.repeats) for r in rounds[k + 1:])
            say(stopped_line(left))
            return ConfirmResult(done, left, result.stopped_by)
    if refused.rounds:
        say(stopped_line(refused.pending()))
        return ConfirmResult(done, refused.pending(), "timeout")
    return ConfirmResult(done, 0, None)


def _row(spec: StudySpec, outcome: TrialOutcome) -> dict:
    """A repeat's columns; like a trial's, objective values are measurements only."""
    values = pick(spec.objectives, outcome.observed) if outcome.state != "failed" else None
    state, cause, objectives, constraints = outcome.state, outcome.cause, {}, {}
    if values is None:
        state, cause = "failed", outcome.cause or "crash"
    else:
        objectives = dict(zip(spec.objectives, values))
        constraints = measured_constraints(spec.slo_obj, outcome.metrics, None, False)
        if not all(v <= 0 for v in constraints.values()):
            state = "infeasible"
        constraints = {k: (v if math.isfinite(v) else 1e9) for k, v in constraints.items()}
    return dict(state=state, cause=cause, detail=outcome.detail, objectives=objectives, constraints=constraints,
                capacity=outcome.capacity, measurement_flags=list(outcome.flags),
                simulated=bool(outcome.startup and outcome.startup.simulated), log_path=outcome.log_path,
                telemetry=summary_for_store(outcome.telemetry) if outcome.telemetry else None)
