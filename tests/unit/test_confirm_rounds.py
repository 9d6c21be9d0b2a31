"""A confirmation round runs whole in one run (tuner/confirm.py): a fresh round that the time left cannot
hold is not started, also when the run's whole time could never hold one (it says what a round needs); a
round cut in an earlier run is not finished by a later one but replaced, so its pairs never span two runs
(another machine, another night), and the verdict waits for enough rounds paired with the baseline.
Through a real SQLite store, with a runner that measures nothing and a clock that only it moves (600 s a
repeat)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autotune.spec import build_spec
from autotune.store.repository import ResultStore
from autotune.tuner import confirm
from autotune.tuner.confirm import Round, run_round
from autotune.telemetry.base import TelemetrySummary
from autotune.tuner.trial import TrialOutcome

OBJECTIVES = [["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]]


class CountingRunner:
    """Stands in for TrialRunner: every repeat it is asked for takes 600 s of `now` and meets the SLO at
    2,000 tok/s."""

    def __init__(self) -> None:
        self.ran: list[int] = []
        self.now = 0.0

    def run(self, number: int, *args: Any, **kwargs: Any) -> TrialOutcome:
        self.ran.append(number)
        self.now += 600.0
        return TrialOutcome("ok", observed={"capacity_tps": 2000.0, "p50_tpot_ms": 12.0},
                            metrics={"p99_ttft_ms": 500.0},
                            telemetry=TelemetrySummary("nvml", peak_mem_used_mib=76_000.0 + number,
                                                       mem_total_mib=81_559.0, series=[{"t": 0.0}]))


def _setup(tmp_path: Path, count: int = 2) -> tuple[Any, ResultStore, Any, list[Any]]:
    spec = build_spec({"name": "r", "model": "/models/m", "slo": "ttft:p99<=1s",
                       "objectives": ["capacity_tps", "p50_tpot_ms"]}, "t")
    store = ResultStore(f"sqlite:///{tmp_path}/r.db")
    study = store.ensure_study(
        name="r", model="/models/m", engine_kind="vllm", engine_command=["vllm", "serve"], fixed_flags=[],
        space_hash="h", spec_hash="x", spec={}, objectives=OBJECTIVES, slo="ttft:p99<=1000ms", quality_knobs=[])
    trials = [store.save_trial(study.id, n, optuna_trial_id=n, role=role, state="ok", params={}, flags=flags,
                               objectives={"capacity_tps": 1900.0 + n, "p50_tpot_ms": 12.0},
                               constraints={"slo:ttft:p99": -50.0, "failure": 0.0}, metrics={},
                               spec_hash="x", capacity={"mode": "concurrency", "capacity": 32, "bracket": [32, 40]})
              for n, role, flags in [(0, "baseline", []), (1, "search", ["--max-num-seqs", "64"]),
                                     (2, "search", ["--max-num-seqs", "128"])][:count]]
    return spec, store, study, trials


def _round(store: ResultStore, study: Any, trials: list[Any]) -> Round:
    """Round 0 as plan_rounds hands it over: only the repeats not stored yet."""
    have = {r.trial_id for r in store.confirmations(study.id) if r.round == 0}
    return Round(0, 123, [(i, t) for i, t in enumerate(trials) if t.id not in have])


def _run(spec: Any, store: ResultStore, study: Any, runner: CountingRunner, trials: list[Any], said: list[str],
         left_s: float, budget_s: float | None, monkeypatch: Any) -> Any:
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: runner.now))
    return run_round(spec, store, study, runner, _round(store, study, trials), repeats=3, phase=lambda _: None,
                     say=said.append, deadline=runner.now + left_s, expected_s=600.0, budget_s=budget_s)


def test_a_fresh_round_that_the_deadline_would_cut_is_not_started(tmp_path: Path, monkeypatch) -> None:
    spec, store, study, trials = _setup(tmp_path)
    runner, said = CountingRunner(), []
    # two repeats of ~600 s each, ~1,000 s left: the first would fit, the round would not
    result = _run(spec, store, study, runner, trials, said, left_s=1000, budget_s=8 * 3600, monkeypatch=monkeypatch)
    assert (result.done, result.pending, result.stopped_by) == (0, 2, "timeout")
    assert runner.ran == [] and store.confirmations(study.id) == []
    assert any("round not started: its 2 repeat(s) take ~1200 s" in s for s in said), said
    # with room for the whole round it runs, in the round's order
    result = _run(spec, store, study, runner, trials, said, left_s=1300, budget_s=8 * 3600, monkeypatch=monkeypatch)
    assert (result.done, result.pending, result.stopped_by) == (2, 0, None) and runner.ran == [0, 1]
    # each repeat keeps its own telemetry summary (not the raw series), as a trial does
    tel = [r.telemetry for r in store.confirmations(study.id)]
    assert [t["peak_mem_used_mib"] for t in tel] == [76_000.0, 76_001.0] and not any("series" in t for t in tel)


def test_a_round_another_process_began_is_finished_repeat_by_repeat(tmp_path: Path, monkeypatch) -> None:
    """Two processes confirming one study: the other stored a repeat of this round after this one planned
    it. The round is begun, so it is not held back for the whole round's time; the stored repeat is skipped."""
    spec, store, study, trials = _setup(tmp_path, count=3)
    runner, said = CountingRunner(), []
    rnd = Round(0, 123, list(enumerate(trials)))
    store.save_confirmation(study_id=study.id, trial_id=trials[0].id, round=0, position=0, seed=123, state="ok",
                            objectives={"capacity_tps": 1950.0, "p50_tpot_ms": 12.0}, constraints={})
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: runner.now))
    # two repeats left (~1,200 s), ~700 s: one more repeat fits; the cut round counts whole as left
    result = run_round(spec, store, study, runner, rnd, repeats=3, phase=lambda _: None, say=said.append,
                       deadline=700.0, expected_s=600.0, budget_s=8 * 3600)
    assert (result.done, result.pending, result.stopped_by) == (1, 3, "timeout") and runner.ran == [1]
    assert not any("round not started" in s for s in said)


def test_an_invocation_too_short_for_any_round_runs_none_and_says_what_a_round_needs(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """It once ran such rounds repeat by repeat, which left the H100 decode study's round 2 with three of
    its four repeats on one machine and the baseline's for the next."""
    spec, store, study, trials = _setup(tmp_path)
    runner, said = CountingRunner(), []
    result = _run(spec, store, study, runner, trials, said, left_s=1000, budget_s=1000, monkeypatch=monkeypatch)
    assert (result.done, result.pending, result.stopped_by) == (0, 2, "timeout") and runner.ran == []
    assert any("round not started: its 2 repeat(s) take ~1200 s and 1000 s are left" in s
               and "this run's whole time, 1000 s, can never hold this round: give it at least 1200 s" in s
               for s in said), said


def test_a_round_cut_in_an_earlier_run_is_replaced_not_finished(tmp_path: Path) -> None:
    """The H100 decode study after session 29: round 1 whole; round 2 holds #4, #3 and #1 but not the
    baseline's repeat. The plan runs rounds 3 and 4 whole instead; until they ran, each candidate has one
    round paired with the baseline and its verdict waits."""
    from autotune.tuner.verdict import summarize_confirmations

    spec, store, study, trials = _setup(tmp_path, count=3)
    objectives = {"capacity_tps": 2000.0, "p50_tpot_ms": 12.0}
    for r, which in ((0, trials), (1, trials[1:])):
        for pos, t in enumerate(which):
            store.save_confirmation(study_id=study.id, trial_id=t.id, round=r, position=pos, seed=1, state="ok",
                                    objectives=objectives, constraints={})
    rows = store.confirmations(study.id)
    assert confirm.rounds_to_run(trials, rows, 3) == ([(2, trials), (3, trials)], [1])
    assert [(r, n) for r, n, _ in confirm.round_times(trials, rows, 3, 600.0)] == [(2, 3), (3, 3)]
    said: list[str] = []
    rounds = confirm.plan_rounds(spec, store, study, top_k=2, repeats=3, say=said.append)
    assert [(rnd.number, [t.number for _, t in rnd.repeats]) for rnd in rounds] == [(2, [0, 2, 1]), (3, [1, 2, 0])]
    assert any("round(s) 2 cut in an earlier run" in s and "round(s) 3, 4 run instead" in s for s in said), said
    assert confirm.rounds_said(rounds, 3) == 4       # "[confirm 3/4]", "[confirm 4/4]"
    # after round 3: the baseline has 2 repeats, the candidates 3 but only 2 rounds paired with the baseline
    for pos, t in enumerate(trials):
        store.save_confirmation(study_id=study.id, trial_id=t.id, round=2, position=pos, seed=1, state="ok",
                                objectives=objectives, constraints={})
    confirmed = summarize_confirmations(study, store.trials(study.id), store.confirmations(study.id))
    assert [(n, c.pending, c.why_not) for n, c in sorted(confirmed.items())] == [
        (0, True, "2 of 3 repeats so far"), (1, True, "2 of 3 rounds paired with the baseline so far"),
        (2, True, "2 of 3 rounds paired with the baseline so far")]
    assert confirm.rounds_to_run(trials, store.confirmations(study.id), 3) == ([(3, trials)], [1])
    for pos, t in enumerate(trials):
        store.save_confirmation(study_id=study.id, trial_id=t.id, round=3, position=pos, seed=1, state="ok",
                                objectives=objectives, constraints={})
    said.clear()      # all done: the cut round is still named, with no empty list of rounds run instead
    assert confirm.plan_rounds(spec, store, study, top_k=2, repeats=3, say=said.append) == []
    assert any("round(s) 2 cut in an earlier run" in s and "later rounds replaced it" in s for s in said), said


def test_a_configuration_joining_late_keeps_the_rounds_the_others_finished(tmp_path: Path) -> None:
    """The H100 decode study in session 30: rounds 1 and 3 whole, round 2 without the baseline; then the
    baseline's two repeats (14,847 and 10,954 tok/s) widened the noise circle and #7 joined. Counted per
    round, #7's arrival made rounds 1 and 3 look cut and the plan began again with three rounds of five
    (~1,091 s each). Counted per configuration: one round of all, then two of the baseline and the newcomer."""
    spec, store, study, trials = _setup(tmp_path, count=3)
    base, old, late = trials
    objectives = {"capacity_tps": 2000.0, "p50_tpot_ms": 12.0}
    for r, which in ((0, [base, old]), (1, [old]), (2, [base, old])):
        for pos, t in enumerate(which):
            store.save_confirmation(study_id=study.id, trial_id=t.id, round=r, position=pos, seed=1, state="ok",
                                    objectives=objectives, constraints={})
    rows = store.confirmations(study.id)
    todo, cut = confirm.rounds_to_run(trials, rows, 3)
    assert [(r, [t.number for t in held]) for r, held in todo] == [(3, [0, 1, 2]), (4, [0, 2]), (5, [0, 2])]
    assert cut == [1]
    assert [(r, n) for r, n, _ in confirm.round_times(trials, rows, 3, 600.0)] == [(3, 3), (4, 2), (5, 2)]
    assert [(r, i, t.number) for r, i, t in confirm.plan(todo)] == [
        (3, 0, 2), (3, 1, 1), (3, 2, 0), (4, 0, 0), (4, 1, 2), (5, 0, 2), (5, 1, 0)]
    # without the newcomer the same rows need one round, and with all of them run nothing is left
    assert confirm.rounds_to_run([base, old], rows, 3) == ([(3, [base, old])], [1])
    for r, held in todo:
        for pos, t in enumerate(held):
            store.save_confirmation(study_id=study.id, trial_id=t.id, round=r, position=pos, seed=1, state="ok",
                                    objectives=objectives, constraints={})
    assert confirm.rounds_to_run(trials, store.confirmations(study.id), 3) == ([], [1])


def test_a_round_is_timed_by_its_own_configurations_not_the_median_trial(tmp_path: Path, monkeypatch) -> None:
    """The picked configurations run longer than the study's median trial (600 s here): a round is
    timed by each one's earlier repeats, else its first run, so a round that would be cut is not begun."""
    spec, store, study, trials = _setup(tmp_path)
    t0 = dt.datetime(2026, 12, 6, 10, 0, 0)
    # the baseline's first run took 1,000 s; the candidate's first run has no finish time (fallback 600 s)
    store.save_trial(study.id, 0, started_at=t0, finished_at=t0 + dt.timedelta(seconds=1000))
    trials = store.trials(study.id)
    assert [confirm.expected_repeat_s(t, [], 600.0) for t in trials] == [1000.0, 600.0]
    runner, said = CountingRunner(), []
    result = _run(spec, store, study, runner, trials, said, left_s=1500, budget_s=8 * 3600, monkeypatch=monkeypatch)
    assert (result.done, result.stopped_by) == (0, "timeout") and runner.ran == []
    assert any("its 2 repeat(s) take ~1600 s and 1500 s are left" in s for s in said), said
    # round 0 ran, its repeats took 800 s and 700 s: round 1 is timed by those (1,500 s), not 1,600 or 1,200
    for trial, took in zip(trials, (800, 700)):
        store.save_confirmation(study_id=study.id, trial_id=trial.id, round=0, position=trial.number, seed=123,
                                state="ok", objectives={"capacity_tps": 1950.0, "p50_tpot_ms": 12.0},
                                constraints={}, started_at=t0, finished_at=t0 + dt.timedelta(seconds=took))
    rows = store.confirmations(study.id)
    assert [confirm.expected_repeat_s(t, rows, 600.0) for t in trials] == [800.0, 700.0]
    said.clear()
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: runner.now))
    result = run_round(spec, store, study, runner, Round(1, 456, [(0, trials[1]), (1, trials[0])]), repeats=3,
                       phase=lambda _: None, say=said.append, deadline=runner.now + 1400, expected_s=600.0,
                       budget_s=8 * 3600)
    assert (result.done, result.stopped_by) == (0, "timeout") and runner.ran == []
    assert any("its 2 repeat(s) take ~1500 s and 1400 s are left" in s for s in said), said


def test_a_round_is_timed_by_each_configurations_longest_repeat(tmp_path: Path) -> None:
    """The H100 decode study's repeat walls (s) for #0, #1, #3, #4: its rounds of four took 956, 976 and
    947 s, where each configuration's median repeat summed to 901 s, so a round begun on that figure with
    920 s left would have been cut. The longest repeat of each sums above every round that ran."""
    spec, store, study, trials = _setup(tmp_path, count=2)
    trials += [store.save_trial(study.id, n, optuna_trial_id=n, role="search", state="ok", params={},
                                flags=["--max-num-seqs", str(n)], objectives={"capacity_tps": 1900.0},
                                constraints={}, metrics={}, spec_hash="x") for n in (3, 4)]
    t0 = dt.datetime(2026, 12, 6, 10, 0, 0)
    walls = {0: (281, 325, 244), 1: (246, 113, 123, 131), 3: (282, 245, 289, 273), 4: (147, 194, 238, 299)}
    for t in trials:
        for r, took in zip((0, 1, 2, 3) if t.number else (0, 2, 3), walls[t.number]):
            store.save_confirmation(study_id=study.id, trial_id=t.id, round=r, position=0, seed=1, state="ok",
                                    objectives={"capacity_tps": 1950.0}, constraints={}, started_at=t0,
                                    finished_at=t0 + dt.timedelta(seconds=took))
    rows = store.confirmations(study.id)
    assert [confirm.expected_repeat_s(t, rows, 190.0) for t in trials] == [325.0, 246.0, 289.0, 299.0]
    (nxt, held, need), *_ = confirm.round_times(trials, rows, 5, 190.0)
    assert (nxt, held, need) == (4, 4, 1159.0) and need > max(956, 976, 947)


def test_the_first_stored_round_stamps_the_median_gap_rule_and_no_later_call_changes_it(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    """A study's spread rule is fixed before its first repeat is stored, so a verdict cannot be re-read
    under another rule once its numbers are known."""
    spec, store, study, trials = _setup(tmp_path)
    assert store.study("r").spread_rule is None
    _run(spec, store, study, CountingRunner(), trials, [], left_s=1300, budget_s=None, monkeypatch=monkeypatch)
    assert store.study("r").spread_rule == "gap" and study.spread_rule == "gap"
    assert store.stamp_spread_rule(study.id, "range", "range") == "gap"
    assert store.study("r").spread_rule == "gap"


def test_a_study_with_rounds_stored_before_the_stamp_keeps_the_range(tmp_path: Path, monkeypatch) -> None:
    """Rows written by an autotune without the stamp were judged by the range; the next round stamps that,
    not the newer rule (the H100 decode study: its round 6 is read as rounds 1-5 were)."""
    spec, store, study, trials = _setup(tmp_path)
    for t in trials:     # round 0 as an older autotune stored it: no stamp
        store.save_confirmation(study_id=study.id, trial_id=t.id, round=0, position=0, seed=1, state="ok",
                                objectives={"capacity_tps": 2000.0, "p50_tpot_ms": 12.0}, constraints={})
    runner = CountingRunner()
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: runner.now))
    run_round(spec, store, study, runner, Round(1, 5, list(enumerate(trials))), repeats=3, phase=lambda _: None,
              say=lambda _: None, expected_s=600.0)
    assert runner.ran == [0, 1] and store.study("r").spread_rule == "range"


def _chat_h100_shape(tmp_path: Path) -> tuple[Any, ResultStore, Any, list[Any]]:
    """The H100 chat study after its round 1: round 1 holds the baseline and #1 but not #2 (the run ended
    first), so rounds 2 and 3 repeat all three and round 4 the baseline and #2 alone. Each first run took
    600 s, which is what a repeat is expected to take."""
    spec, store, study, trials = _setup(tmp_path, count=3)
    t0 = dt.datetime(2026, 12, 7, 12, 0, 0)
    for t in trials:
        store.save_trial(study.id, t.number, started_at=t0, finished_at=t0 + dt.timedelta(seconds=600))
    trials = store.trials(study.id)
    for pos, t in enumerate(trials[:2]):
        store.save_confirmation(study_id=study.id, trial_id=t.id, round=0, position=pos, seed=1, state="ok",
                                objectives={"capacity_tps": 2000.0, "p50_tpot_ms": 12.0}, constraints={})
    rows = store.confirmations(study.id)
    assert [(r, n, s) for r, n, s in confirm.round_times(trials, rows, 3, 0.0)] == [
        (1, 3, 1800.0), (2, 3, 1800.0), (3, 2, 1200.0)]
    return spec, store, study, trials


def test_a_round_too_long_for_the_time_left_gives_way_to_a_later_shorter_one(tmp_path: Path, monkeypatch) -> None:
    """Rounds are independent pairs with seeds of their own: with 1,300 s left, rounds 2 and 3 (1,800 s
    each) do not fit and round 4 (1,200 s) does, so round 4 runs and the call stops after it, saying what
    is left. Round 3 is passed over without a line of its own: it is no shorter than round 2."""
    spec, store, study, trials = _chat_h100_shape(tmp_path)
    runner, said = CountingRunner(), []
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: runner.now))
    result = confirm.confirm_study(spec, store, study, runner, top_k=2, repeats=3, phase=lambda _: None,
                                   say=said.append, deadline=1300.0)
    assert (result.done, result.pending, result.stopped_by) == (2, 6, "timeout")
    assert runner.ran == [2, 0]                     # round 4, odd: the round's order reversed
    assert sorted((r.round, r.trial_id) for r in store.confirmations(study.id))[-2:] == [
        (3, trials[0].id), (3, trials[2].id)]
    assert sum("round not started" in s for s in said) == 1, said
    assert any("[confirm 2/4] round not started: its 3 repeat(s) take ~1800 s and 1300 s are left" in s
               for s in said), said
    assert said[-1] == confirm.stopped_line(6)
    # the next call plans what is still missing: rounds 2 and 3 of all three, nothing more
    assert [(r, [t.number for t in held]) for r, held in
            confirm.rounds_to_run(trials, store.confirmations(study.id), 3)[0]] == [(1, [0, 1, 2]), (2, [0, 1, 2])]
    # with no round that fits, nothing runs and the call says what is left; round 4's repeats are given
    # the 600 s each that the stand-in clock says they took (no wall clock is read)
    t0 = dt.datetime(2026, 12, 7, 13, 0, 0)
    for r in store.confirmations(study.id):
        if r.round == 3:
            store.save_confirmation(study_id=study.id, trial_id=r.trial_id, round=3, started_at=t0,
                                    finished_at=t0 + dt.timedelta(seconds=600))
    said.clear()
    result = confirm.confirm_study(spec, store, study, runner, top_k=2, repeats=3, phase=lambda _: None,
                                   say=said.append, deadline=runner.now + 500.0)
    assert (result.done, result.pending, result.stopped_by) == (0, 6, "timeout") and runner.ran == [2, 0]
    assert sum("round not started" in s for s in said) == 1 and said[-1] == confirm.stopped_line(6)


def test_the_scheduler_s_rounds_give_way_the_same_and_the_last_to_end_stops_the_study(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """`run` and the daemon hand the rounds to the scheduler as jobs (tuner/after_budget.py). A refused
    round no longer stops the later ones; the last job to end sets the stop reason, so the run says to run
    again and the next step (the daemon's report) does not begin as if the confirmation were whole."""
    from autotune.tuner.after_budget import confirm_parts

    spec, store, study, trials = _chat_h100_shape(tmp_path)
    runner, said = CountingRunner(), []
    monkeypatch.setattr(confirm, "time", SimpleNamespace(monotonic=lambda: runner.now))
    spec.confirm.top_k = 2
    driver = SimpleNamespace(spec=spec, store=store, record=study, runner=runner, deadline=1300.0,
                             timeout_s=8 * 3600.0, tag_phases=False, stop_reason=None, fixed_flags=[],
                             progress=SimpleNamespace(message=said.append))
    parts = confirm_parts(driver)
    assert [p.name for p in parts] == ["confirm round 2", "confirm round 3", "confirm round 4"]
    for n, p in enumerate(parts):
        p.run(None, lambda _: None)
        assert driver.stop_reason == (None if n < 2 else "timeout")    # the others may still run
    assert runner.ran == [2, 0] and said[-1] == confirm.stopped_line(6)
    assert sum("round not started" in s for s in said) == 1, said
