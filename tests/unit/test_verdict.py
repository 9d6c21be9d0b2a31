"""The verdict's arithmetic with numbers worked by hand, and the export choice: confirmed medians win, a
candidate leaves the front only on a failed repeat or one that broke the SLO at every load (a median
load below its first run's bracket is information, not a verdict), and a trial carrying a measurement
flag is never exported unconfirmed."""

from __future__ import annotations

import math

import pytest

from autotune.bench import measurement_flags as mflags
from autotune.export.choice import exported_trial
from autotune.report.confirmed import confirmation_lines, rounds_left_text
from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.tuner.confirm import plan, round_seed, round_times, rounds_to_run
from autotune.tuner.picks import pick_candidates
from autotune.tuner.verdict import (objective_verdict, paired_ratio_interval, relative_spread,
                                    summarize_confirmations, t975)
from autotune.tuner.winner import export_choice, unconfirmed_flagged

OBJ = [["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]]


def test_t_interval_on_log_ratios_matches_the_hand_computation():
    # logs of 1.1, 1.2, 1.15: mean 0.139131, sd 0.0435089; t(0.975, 2) = 4.303 -> half 0.108091
    iv = paired_ratio_interval([1.1, 1.2, 1.15])
    assert iv.rounds == 3
    assert iv.ratio == pytest.approx(math.exp(0.139131), abs=1e-5)      # 1.14927
    assert iv.low == pytest.approx(math.exp(0.139131 - 0.108091), abs=1e-4)   # 1.03153
    assert iv.high == pytest.approx(math.exp(0.139131 + 0.108091), abs=1e-4)  # 1.28047
    assert not iv.includes_one()


def test_t_quantiles():
    assert t975(2) == 4.303 and t975(30) == 2.042
    assert t975(200) == pytest.approx(1.972, abs=2e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_identical_ratios_give_a_point_interval_and_a_log_symmetric_one_otherwise():
    iv = paired_ratio_interval([1.25, 1.25, 1.25])
    assert iv.low == pytest.approx(1.25) and iv.high == pytest.approx(1.25)
    up, down = paired_ratio_interval([1.1, 1.3, 1.2]), paired_ratio_interval([1 / 1.1, 1 / 1.3, 1 / 1.2])
    assert up.ratio * down.ratio == pytest.approx(1.0) and up.low * down.high == pytest.approx(1.0)


def test_relative_spread():
    assert relative_spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    # gaps 10, 20, 10: their median 10 over the median 100
    assert relative_spread([90.0, 100.0, 110.0], "gap") == pytest.approx(0.1)
    with pytest.raises(ValueError):
        relative_spread([1.0, 2.0], "iqr")


def test_the_median_gap_does_not_grow_with_repeats_where_the_range_does():
    """The H100 decode study's defaults, 4 repeats (one on the knife-edge of the TPOT bound): the range
    27.8 %, the median gap between two of them 13.9 %. With a 5th repeat like the other three the range
    stays 27.7 % (max - min can only grow); the median gap falls to 1.5 %, what four of five restarts show."""
    base = [14847.15, 10954.44, 14884.70, 15084.74]
    assert relative_spread(base) == pytest.approx(0.2778, abs=1e-4)
    assert relative_spread(base, "gap") == pytest.approx(0.1389, abs=1e-4)
    assert relative_spread(base + [14900.0]) == pytest.approx(0.2775, abs=1e-4)
    assert relative_spread(base + [14900.0], "gap") == pytest.approx(0.0147, abs=1e-4)


def test_under_the_median_gap_rule_the_decode_gain_clears_the_spread():
    """What the proposal written before the confirmations said the rule would do on those four rounds,
    checked; that study itself keeps the range (it was stamped so)."""
    base = [14847.15, 10954.44, 14884.70, 15084.74]
    cand = [17239.46, 17357.58, 17284.39, 18301.57]
    v = objective_verdict("capacity_tps", "maximize", list(zip(base, cand)), base, cand + [17568.06], "gap")
    assert v.spread == pytest.approx(0.1389, abs=1e-4) and v.beyond_noise and v.better
    assert "spread 13.9% (median gap): better" in v.text()


def test_gain_inside_the_interval_or_below_the_spread_is_noise():
    # clear gain: every round +20 % with little scatter, repeats tight
    v = objective_verdict("capacity_tps", "maximize", [(100, 120), (101, 121), (99, 119)], [100, 101, 99], [120, 121, 119])
    assert v.beyond_noise and "better" in v.text()
    # the interval includes 1
    v = objective_verdict("capacity_tps", "maximize", [(100, 110), (100, 95), (100, 104)], [100, 100, 100], [110, 95, 104])
    assert v.interval is not None and v.interval.includes_one() and not v.beyond_noise
    assert "no gain beyond noise" in v.text()
    # the interval excludes 1 (every round +3 %) but one config's repeats spread 30 %
    v = objective_verdict("capacity_tps", "maximize", [(80, 82.4), (100, 103), (110, 113.3)], [80, 100, 110], [82.4, 103, 113.3])
    assert not v.interval.includes_one() and v.spread == pytest.approx(0.3) and not v.beyond_noise
    # a lower TPOT is better for a minimized objective
    v = objective_verdict("p50_tpot_ms", "minimize", [(20, 16), (21, 16.8), (19, 15.2)], [20, 21, 19], [16, 16.8, 15.2])
    assert v.beyond_noise and "better" in v.text() and v.interval.ratio == pytest.approx(0.8)
    # fewer than 3 rounds: no interval, no claim
    v = objective_verdict("capacity_tps", "maximize", [(100, 150), (100, 150)], [100, 100], [150, 150])
    assert v.interval is None and not v.beyond_noise


def test_a_candidate_ahead_in_every_round_but_not_beyond_noise_is_told_what_would_settle_it():
    """The H100 decode study's rounds 1 and 3 with round 1 again as a third: every round favours the
    candidate (x1.161, x1.585, x1.161), the defaults' repeats spread 30 %, so the interval includes 1 and
    no gain is claimed; `show` says every round leaned one way and that more rounds can settle it."""
    pairs = [(14847, 17239), (10954, 17358), (14847, 17239)]
    v = objective_verdict("capacity_tps", "maximize", pairs, [a for a, _ in pairs], [b for _, b in pairs])
    assert v.interval.includes_one() and not v.beyond_noise and not v.better and v.leaning()
    assert v.text().endswith("no gain beyond noise (every round above 1: x1.161-x1.585)")
    # one round the other way: no leaning, no hint
    w = objective_verdict("capacity_tps", "maximize", [(100, 110), (100, 95), (100, 104)], [100] * 3, [110, 95, 104])
    assert not w.leaning() and w.text().endswith("no gain beyond noise")
    # leaning but the interval excludes 1 (held back by the spread rule): more rounds are not the answer
    x = objective_verdict("capacity_tps", "maximize", [(80, 82.4), (100, 103), (110, 113.3)], [80, 100, 110],
                          [82.4, 103, 113.3])
    assert not x.beyond_noise and not x.leaning()
    s = _study()
    base, cand = _trial(0, "baseline", tps=16636), _trial(1, tps=17895)
    rows = _rows(base, [(a, 16.7) for a, _ in pairs]) + _rows(cand, [(b, 18.5) for _, b in pairs])
    lines = confirmation_lines(s, [base, cand], summarize_confirmations(s, [base, cand], rows))
    assert ("capacity_tps of #1 leaned the same way in every paired round, yet the interval includes 1: more rounds "
            "can settle it (`autotune confirm --repeats 5` adds 2); no gain is claimed until then") in lines


def test_a_gain_held_back_by_the_spread_is_told_apart_from_a_short_interval():
    """The H100 decode study's four paired rounds (session 32): #1's interval clears 1 by a hair, but the
    defaults' repeats spread 27.8 % (one at 10,954 tok/s) and the gain is 26.9 %, so no gain is claimed;
    `show` says why and that more rounds do not settle it, instead of promising that they can."""
    base = [14847.15, 10954.44, 14884.70, 15084.74]
    cand = [17239.46, 17357.58, 17284.39, 18301.57]
    v = objective_verdict("capacity_tps", "maximize", list(zip(base, cand)), base, cand + [17568.06])
    assert (round(v.interval.ratio, 3), round(v.interval.low, 3), round(v.interval.high, 3)) == (1.269, 1.000, 1.610)
    assert not v.interval.includes_one() and v.spread == pytest.approx(0.2779, abs=1e-4)
    assert not v.beyond_noise and v.held_by_spread() and not v.leaning() and not v.more_rounds_can_settle()
    assert v.text().endswith("no gain beyond noise (the interval clears 1, but the difference 26.9% is below the "
                             "spread 27.8% of one configuration's repeats)")
    # every round above 1, the interval includes 1 and the difference is below the spread: both are said
    w = objective_verdict("capacity_tps", "maximize", [(100, 104), (70, 100), (100, 101)], [100, 70, 100], [104, 100, 101])
    assert w.leaning() and w.held_by_spread() and not w.more_rounds_can_settle()
    assert "(every round above 1: x1.010-x1.429; the difference" in w.text()
    s = _study()
    bt, ct = _trial(0, "baseline", tps=16636), _trial(1, tps=17895)
    rows = _rows(bt, [(a, 16.7) for a in base]) + _rows(ct, [(b, 18.5) for b in cand])
    lines = confirmation_lines(s, [bt, ct], summarize_confirmations(s, [bt, ct], rows))
    assert ("capacity_tps of #1 leaned one way, but the difference is below the spread of one configuration's "
            "repeats: more rounds do not settle that (max - min over repeats never narrows); no gain is claimed") in lines
    assert not any("can settle it" in line for line in lines)


def test_the_more_rounds_hint_counts_paired_rounds_as_confirm_repeats_does():
    """`confirm --repeats N` asks for N rounds paired with the baseline per configuration; a round cut
    before the baseline ran (the H100 decode study's second) pairs nothing, so the hint counts pairs."""
    s = _study()
    base, cand = _trial(0, "baseline", tps=16636), _trial(1, tps=17895)
    rows = (_rows(base, [(14847, 16.7), (10954, 16.7), (14847, 16.7)], rounds=[0, 2, 3])
            + _rows(cand, [(17239, 18.5), (17500, 18.5), (17358, 18.5), (17239, 18.5)]))
    confirmed = summarize_confirmations(s, [base, cand], rows)
    assert confirmed[1].verdicts[0].interval.rounds == 3 and confirmed[1].verdicts[0].more_rounds_can_settle()
    lines = confirmation_lines(s, [base, cand], confirmed)
    assert any("(`autotune confirm --repeats 5` adds 2)" in line for line in lines)
    todo, cut = rounds_to_run([base, cand], rows, 5)
    assert [r for r, _ in todo] == [4, 5] and cut == [1]


def _study(quality=()):
    return StudyRecord(id=1, name="s", objectives=OBJ, quality_knobs=list(quality))


def _trial(i, role="search", cap=10.0, tps=100.0, tpot=20.0, flags=None, params=None, bracket=None):
    return TrialRecord(id=100 + i, number=i, role=role, state="ok", objectives={"capacity_tps": tps, "p50_tpot_ms": tpot},
                       constraints={"slo:ttft:p99": -5.0, "failure": 0.0}, metrics={}, params=params or {"x": i},
                       flags=[f"--x={i}"] if role != "baseline" else [],
                       capacity={"capacity": cap, "bracket": bracket or [cap, cap + 1]}, measurement_flags=flags)


def _rows(trial, values, caps=None, states=None, rounds=None):
    out = []
    for r, (tps, tpot) in enumerate(values):
        state = (states or ["ok"] * len(values))[r]
        out.append(ConfirmationRecord(trial_id=trial.id, round=(rounds or range(len(values)))[r], position=0, seed=r, state=state,
                                      cause="crash" if state == "failed" else None,
                                      objectives={} if state == "failed" else {"capacity_tps": tps, "p50_tpot_ms": tpot},
                                      constraints={"slo:ttft:p99": 50.0 if state == "infeasible" else -5.0},
                                      capacity={"capacity": (caps or [trial.capacity["capacity"]] * len(values))[r]}))
    return out


@pytest.mark.parametrize("flag", mflags.ALL)
def test_without_confirmation_a_flagged_trial_is_never_exported(flag):
    s = _study()
    base = _trial(0, "baseline", tps=100)
    flagged = _trial(1, tps=200, flags=[flag])
    clean = _trial(2, tps=150)
    choice = export_choice(s, [base, flagged, clean], [])
    assert choice.trial is clean and choice.confirmed is None
    assert "UNCONFIRMED" in choice.why and f"trial 1 measured better but carries {flag}" in choice.why
    assert unconfirmed_flagged(flagged, [], s, [base, flagged, clean]) is not None
    assert unconfirmed_flagged(clean, [], s, [base, flagged, clean]) is None
    # only flagged trials: nothing is exported
    lone = [_trial(0, "baseline", flags=["wide_bracket"]), _trial(1, flags=["prefix_hits"])]
    choice = export_choice(s, lone, [])
    assert choice.trial is None and "autotune confirm" in choice.why


def test_confirmed_medians_decide_and_a_confirmed_flagged_trial_may_win():
    s = _study()
    base = _trial(0, "baseline", cap=8, tps=100)
    a = _trial(1, cap=10, tps=130, flags=["wide_bracket"])
    b = _trial(2, cap=9, tps=125)
    rows = (_rows(base, [(100, 20), (98, 20), (102, 20)], caps=[8, 8, 9])
            + _rows(a, [(121, 19), (119, 19), (123, 19)], caps=[10, 11, 10])
            + _rows(b, [(126, 18), (124, 18), (127, 18)], caps=[9, 9, 10]))
    confirmed = summarize_confirmations(s, [base, a, b], rows)
    assert all(c.survives for c in confirmed.values())
    assert confirmed[2].medians["capacity_tps"] == 126
    choice = export_choice(s, [base, a, b], rows)
    assert choice.trial is b and choice.confirmed.medians == confirmed[2].medians   # b beats a on confirmed medians
    assert unconfirmed_flagged(a, rows, s, [base, a, b]) is None         # a is confirmed: exportable by --trial
    assert confirmed[2].verdicts[0].beyond_noise                         # +25 % every round


def test_a_candidate_leaves_the_front_only_on_a_failed_repeat_or_the_slo_broken_at_every_load():
    s = _study()
    base = _trial(0, "baseline", cap=8, tps=100)
    crashed = _trial(1, cap=10, tps=200)
    below = _trial(2, cap=12, tps=190, bracket=[12, 13])
    broken = _trial(3, cap=11, tps=180)
    rows = (_rows(base, [(100, 20)] * 3)
            + _rows(crashed, [(200, 20), (0, 0), (200, 20)], states=["ok", "failed", "ok"])
            # its repeats met the SLO at lower loads than the first run (9 / 10 / 13 against 12) and measured
            # less than the first run: it stays, ranked by its median
            + _rows(below, [(150, 20)] * 3, caps=[9, 10, 13])
            + _rows(broken, [(180, 20), (0, 20), (180, 20)], states=["ok", "infeasible", "ok"], caps=[11, None, 11]))
    trials = [base, crashed, below, broken]
    confirmed = summarize_confirmations(s, trials, rows)
    assert not confirmed[1].survives and "repeat 2 failed (crash)" in confirmed[1].why_not
    assert not confirmed[3].survives and confirmed[3].why_not == "repeat 2 broke the SLO at every load"
    assert confirmed[2].survives and confirmed[2].medians["capacity_tps"] == 150
    assert confirmed[2].reproduced("capacity_tps") is False and confirmed[2].loads() == [9, 10, 13]
    choice = export_choice(s, trials, rows)
    assert choice.trial is below and "over 3 repeats, capacity_tps against the baseline: better" in choice.why
    # a candidate that crashed in a repeat against a baseline that held: the baseline is exported, with why
    rows = _rows(base, [(100, 20)] * 3) + _rows(crashed, [(200, 20), (0, 0), (200, 20)], states=["ok", "failed", "ok"])
    choice = export_choice(s, [base, crashed], rows)
    assert choice.trial is base and choice.notes == ["no candidate beat it after confirmation: #1 left the front "
                                                     "(repeat 2 failed (crash))"]
    # nothing is exported only when the baseline did not hold either
    rows = (_rows(base, [(100, 20), (0, 0), (100, 20)], states=["ok", "failed", "ok"])
            + _rows(crashed, [(200, 20), (0, 0), (200, 20)], states=["ok", "failed", "ok"]))
    choice = export_choice(s, [base, crashed], rows)
    assert choice.trial is None and "\n" not in choice.why
    assert choice.why.startswith("the baseline #0 did not survive its repeats (repeat 2 failed (crash)) and no "
                                 "candidate qualifies: #1 left the front")


def test_show_and_the_export_header_give_one_verdict_when_the_baseline_left_the_front():
    """A baseline that crashed in its fourth repeat leaves the front; its three measured rounds are still
    the paired reference: `show` and the export's header (of a trial named with --trial) state the same
    verdict, and with the candidate worse and the baseline out, nothing is exported."""
    s = _study()
    base = _trial(0, "baseline", cap=55, tps=2026, bracket=[55, 224])
    cand = _trial(1, cap=6, tps=295, bracket=[6, 12])
    rows = (_rows(base, [(935, 5), (900, 4), (1000, 6), (0, 0)], caps=[16, 15, 20, 0], states=["ok"] * 3 + ["failed"])
            + _rows(cand, [(589, 1), (560, 1), (600, 1), (590, 1)], caps=[6] * 4))
    confirmed = summarize_confirmations(s, [base, cand], rows)
    assert not confirmed[0].survives and confirmed[1].survives
    verdict = "; ".join(v.text() for v in confirmed[1].verdicts)
    assert "capacity_tps x0.617 [0.580, 0.657]" in verdict and "over 3 paired rounds" in verdict and confirmed[1].verdicts[0].worse
    choice = export_choice(s, [base, cand], rows)
    assert choice.trial is None and "#1 is worse (capacity_tps x0.617" in choice.why
    named = exported_trial(s, [base, cand], rows, number=1)
    shown = confirmation_lines(s, [base, cand], confirmed)
    assert f"against the baseline: {verdict}" in named.header
    assert f"#1 against the baseline #0: {verdict}" in shown
    assert any("the baseline #0 left the front (repeat 4 failed (crash))" in line for line in shown)
    assert not any("no confirmed baseline" in line for line in shown)


def test_the_h200_fp8_confirmation_exports_fp8_ranked_by_its_repeats():
    """The H200 confirmation of the FP8 study (benchmarks/gpu/confirm/): every configuration's repeats met
    the SLO at lower loads than its first run, and FP8 beat the defaults in each round. Under the old
    bracket rule nothing survived and nothing was exported; now both stay, FP8 is exported on its
    confirmed median (its first run, 4,824 tok/s, is reported as not reproduced) and the output-preserving
    export is the baseline."""
    s = _study(quality=["quantization"])
    base = _trial(0, "baseline", cap=40, tps=2785, bracket=[40, 41], params={"quantization": "none"})
    fp8 = _trial(2, "enqueued", cap=58, tps=4824, bracket=[58, 59], params={"quantization": "fp8"})
    rows = (_rows(base, [(2577, 8.4), (2671, 9.4), (2699, 9.3)], caps=[34, 39, 39])
            + _rows(fp8, [(3706, 8.7), (4045, 7.8), (3375, 9.0)], caps=[49, 49, 47]))
    confirmed = summarize_confirmations(s, [base, fp8], rows)
    assert confirmed[0].survives and confirmed[2].survives and confirmed[2].quality == {"quantization": "fp8"}
    assert confirmed[2].reproduced("capacity_tps") is False and confirmed[0].reproduced("capacity_tps") is True
    shown = confirmation_lines(s, [base, fp8], confirmed)
    line = next(x for x in shown if x.startswith("  #2 (enqueued, changes output quality: quantization=fp8)"))
    assert "first run 4824 -> median 3706 (x0.768): FIRST RUN NOT REPRODUCED" in line
    assert "SLO held at load 58-59 in the first run, 49 / 49 / 47 in the repeats (median 49, spread 4%)" in line
    assert any("#2 against the baseline #0: capacity_tps x1.396 [1.092, 1.786] over 3 paired rounds, spread 18.1% (range): "
               "better" in x for x in shown)
    assert export_choice(s, [base, fp8], rows).trial is fp8
    keeps = export_choice(s, [base, fp8], rows, output_preserving=True)
    assert keeps.trial is base and keeps.notes == ["no output-preserving candidate was confirmed beside it"]


def test_candidates_plan_and_seeds():
    s = _study(quality=["kv_cache_dtype"])
    base = _trial(0, "baseline", tps=100, params={"kv_cache_dtype": "auto"})
    fp8 = _trial(1, tps=180, tpot=30, params={"kv_cache_dtype": "fp8"})
    plain = _trial(2, tps=120, tpot=25, params={"kv_cache_dtype": "auto"})
    fast = _trial(3, tps=110, tpot=15, params={"kv_cache_dtype": "auto"})
    picked = pick_candidates(s, [base, fp8, plain, fast], k=3).candidates
    # best overall (quality-changing), then the best output-preserving, then the rest of the front
    assert [t.number for t in picked] == [1, 2, 3]
    assert [t.number for t in pick_candidates(s, [base, fp8, plain, fast], k=1).candidates] == [1]
    order = [(r, t.number) for r, _, t in plan([(r, [base, fp8, plain]) for r in range(3)])]
    assert order == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert len({round_seed(0, r) for r in range(3)}) == 3 and round_seed(0, 0) != 0


def test_an_unfinished_confirmation_decides_nothing_yet():
    s = _study()
    base = _trial(0, "baseline", tps=100)
    flagged = _trial(1, tps=200, flags=["client_saturated"])
    rows = _rows(base, [(100, 20)]) + _rows(flagged, [(190, 20)])          # 1 of 3 rounds each (cut short)
    choice = export_choice(s, [base, flagged], rows)
    assert choice.trial is base and choice.confirmed is None               # the unflagged one, UNCONFIRMED
    assert "UNCONFIRMED" in choice.why and "confirmation not finished" in choice.why
    assert summarize_confirmations(s, [base, flagged], rows)[1].pending


def test_flags_of_a_trial_stored_before_the_column_are_read_from_its_evidence():
    from autotune.tuner.verdict import flags_of
    old = _trial(1)
    old.measurement_flags = None
    old.capacity = {"capacity": 8, "note": "client saturated in a step: its latencies are not trusted; the prefix "
                                           "cache served random prompts at load 8: those steps' latencies are flattered"}
    assert flags_of(old) == ["client_saturated", "prefix_hits"]
    s = _study()
    assert export_choice(s, [_trial(0, "baseline", tps=50), old], []).trial.number == 0
    old.capacity = {"capacity": 8, "note": ""}
    assert flags_of(old) == [] and flags_of(_trial(2, flags=["overlapped"])) == ["overlapped"]


def test_the_export_says_what_a_winner_costs_on_the_other_objectives():
    """The H200 chat study's best first run (an SLO on TTFT only) had x1.26 the defaults' capacity at
    x5.6 their p50 TPOT; the line that says why it is exported must say both, first runs or confirmed."""
    s = _study()
    base = _trial(0, "baseline", tps=2570, tpot=8.61)
    fast = _trial(11, tps=3248, tpot=48.48)
    choice = export_choice(s, [base, fast], [])
    assert choice.trial is fast
    assert choice.why.endswith("; at a cost in its first run: p50_tpot_ms 48.48 against the baseline's 8.61 (x5.63)")
    # within the noise floor (5 %) on the other objective: no cost named
    close = _trial(2, tps=3000, tpot=9.0)
    assert "at a cost" not in export_choice(s, [base, close], []).why
    # confirmed: the paired verdict of the other objective, where it is worse beyond noise
    rows = (_rows(base, [(2570, 8.6), (2600, 8.7), (2550, 8.5)])
            + _rows(fast, [(3200, 48.0), (3260, 49.0), (3150, 47.5)]))
    choice = export_choice(s, [base, fast], rows)
    assert choice.trial is fast and "capacity_tps against the baseline: better; at a cost: p50_tpot_ms x5." in choice.why
    assert choice.why.endswith(": worse")
    # confirmed and better on both: nothing to name
    rows = (_rows(base, [(2570, 8.6), (2600, 8.7), (2550, 8.5)])
            + _rows(close, [(3000, 8.0), (3010, 8.1), (2990, 7.9)]))
    assert "at a cost" not in export_choice(s, [base, close], rows).why


def test_the_confirmation_also_repeats_the_best_first_run_that_costs_nothing_on_the_other_objectives():
    """The H200 chat study's first runs (capacity_tps, p50 TPOT): the two best were nearly the same config
    and paid x4.6-x5.6 in TPOT; top 2 by the front alone would repeat both and leave out #4, the best
    at the defaults' TPOT."""
    s = _study()
    base = _trial(0, "baseline", tps=2570, tpot=8.61)
    trials = [base, _trial(11, tps=3248, tpot=48.48), _trial(8, tps=3063, tpot=39.32),
              _trial(4, tps=2761, tpot=8.658), _trial(1, tps=2561, tpot=8.456), _trial(7, tps=1568, tpot=7.411)]
    picks = pick_candidates(s, trials, k=2)
    assert [t.number for t in picks.candidates] == [11, 4]
    assert picks.costless == ("#4 is the best first run that costs nothing on the other objectives (the best, #11: "
                              "p50_tpot_ms 48.48 against the baseline's 8.61 (x5.63))")
    # one seat: the best alone; three: the front's next member after the costless one
    assert [t.number for t in pick_candidates(s, trials, k=1).candidates] == [11]
    assert [t.number for t in pick_candidates(s, trials, k=3).candidates] == [11, 4, 8]
    # a best that costs nothing: the front by the first objective, as before
    cheap = [base, _trial(1, tps=3000, tpot=8.7), _trial(3, tps=2900, tpot=7.0), _trial(2, tps=2800, tpot=8.0)]
    picks = pick_candidates(s, cheap, k=2)
    assert [t.number for t in picks.candidates] == [1, 3] and picks.costless == ""


def test_an_unfinished_confirmation_says_how_long_each_round_left_will_take():
    """Each round left is timed by its configurations' repeats so far, else their first runs, so a user can
    tell whether a session holds one (a round runs whole). Round 1 here holds #0 and #1 but not #4 (cut
    after #1): its pair counts, so two rounds of all three are left and a third of #0 and #4."""
    import datetime as dt

    s = _study()
    t0 = dt.datetime(2026, 12, 6, 10, 52)
    base, cand, fresh = _trial(0, "baseline", tps=16636), _trial(1, tps=17895), _trial(4, tps=17336)
    fresh.started_at, fresh.finished_at = t0, t0 + dt.timedelta(seconds=226)      # no repeat yet: its first run
    rows = _rows(base, [(14847, 16.7)]) + _rows(cand, [(17239, 18.5)])
    for r, took in zip(rows, (281, 246)):
        r.started_at, r.finished_at = t0, t0 + dt.timedelta(seconds=took)
    times = round_times([base, cand, fresh], rows, 3, fallback_s=190.0)
    assert times == [(1, 3, 753.0), (2, 3, 753.0), (3, 2, 507.0)]
    said = rounds_left_text(times)
    assert said.startswith("8 repeat(s) left: round 2 ~753 s, round 3 ~753 s, round 4 ~507 s (")
    shown = confirmation_lines(s, [base, cand, fresh], summarize_confirmations(s, [base, cand, fresh], rows),
                               to_run=f"to run: #0, #1, #4; {said}")
    assert "CONFIRMATION NOT FINISHED: `autotune confirm` continues it; to run: #0, #1, #4; 8 repeat(s)" in shown[-2]
    # and what those rounds can decide: #1 has one paired round (#4 none yet, so nothing to say of it)
    assert shown[-1].endswith("#1 (so far x1.161) is better at x1.082 or more in each of its 2 rounds left")
    # nothing to go by but the study's median trial: that, as before
    fresh.finished_at = None
    assert round_times([fresh], [], 3, fallback_s=190.0) == [(0, 1, 190.0), (1, 1, 190.0), (2, 1, 190.0)]
    # nothing at all: no figure rather than a wrong one
    assert rounds_left_text(round_times([fresh], [], 3, fallback_s=0.0)) == ""


def test_a_verdict_says_which_rounds_paired_repeats_run_hours_apart():
    """The H200 long study: rounds 2 and 3 were resumed in later sessions, so #14's round-3 repeat ran 36 h
    after the baseline's, on another machine. `show` and the export header say so beside the verdict;
    pairs of one sitting are not named."""
    import datetime as dt

    s = _study()
    base = _trial(0, "baseline", tps=1134)
    cand = _trial(14, tps=1210)
    rows = _rows(base, [(1149, 15), (1138, 15), (1092, 15)]) + _rows(cand, [(1070, 15), (1094, 15), (1130, 15)])
    t0 = dt.datetime(2026, 12, 4, 2, 50)
    for r in rows:
        after = {(base.id, 0): 0, (base.id, 1): 4 * 3600, (base.id, 2): 18 * 3600,
                 (cand.id, 0): 600, (cand.id, 1): 600, (cand.id, 2): 54 * 3600}[(r.trial_id, r.round)]
        r.started_at = t0 + dt.timedelta(seconds=after)
    confirmed = summarize_confirmations(s, [base, cand], rows)
    shown = confirmation_lines(s, [base, cand], confirmed)
    line = next(x for x in shown if x.startswith("#14 against the baseline #0"))
    assert "(pairs run apart: round 2 3.8 h, round 3 36.0 h;" in line and "round 1" not in line
    named = exported_trial(s, [base, cand], rows, number=14)
    assert any("pairs run apart: round 2 3.8 h, round 3 36.0 h" in h for h in named.header)
    # one sitting: nothing said
    for r in rows:
        r.started_at = t0 + dt.timedelta(seconds=300 * r.round + (60 if r.trial_id == cand.id else 0))
    shown = confirmation_lines(s, [base, cand], summarize_confirmations(s, [base, cand], rows))
    assert not any("pairs run apart" in x for x in shown)


def test_a_repeat_faster_at_a_lower_met_load_is_said_beside_the_load_it_is_read_at():
    """The H100 decode study's defaults, round 6: 12,318 tok/s at 128 streams and 10,649 at 216, both within
    the SLO; capacity_tps is read at 216. A repeat within the noise floor (+4 %) is not counted."""
    from autotune.report.confirmed import met_steps, peak_text

    def steps(*xs):
        return [{"load": load, "slo_met": met, "steady_output_throughput": tps} for load, met, tps in xs]

    s = _study()
    base = _trial(0, "baseline", cap=343, tps=16636)
    rows = _rows(base, [(10649, 19.0), (14847, 18.5), (15085, 17.6)], caps=[216, 266, 289])
    rows[0].capacity["steps"] = steps((343, False, None), (128, True, 12318), (181, True, 11235), (216, True, 10649),
                                      (236, False, None))
    rows[1].capacity["steps"] = steps((257, True, 15400), (266, True, 14847), (300, False, None))   # +3.7 %
    rows[2].capacity["steps"] = steps((289, True, 15085))
    assert met_steps(rows[0].capacity) == [(128.0, 12318.0), (181.0, 11235.0), (216.0, 10649.0)]
    assert met_steps(None) == [] and met_steps({"capacity": 5}) == []
    confirmed = summarize_confirmations(s, [base], rows)
    assert peak_text(confirmed[0]) == ("output tok/s higher at a lower met load in 1 of 3 repeat(s) (at most 1.232e+04 "
                                       "at load 128 against 1.065e+04 at 216, the highest met load, where it is read)")
    line = next(x for x in confirmation_lines(s, [base], confirmed) if x.startswith("  #0 (baseline)"))
    assert "(median 266, spread 27%); output tok/s higher at a lower met load in 1 of 3" in line
    rows[0].capacity["steps"] = steps((216, True, 10649))
    assert peak_text(summarize_confirmations(s, [base], rows)[0]) == ""


def _flagged(i, n, **kw):
    t = _trial(i, **kw)
    t.flags = [f"--k{j}={i}" for j in range(n)]
    return t


def test_a_candidate_as_good_with_fewer_flags_is_exported_in_place_of_the_best_median():
    """The H100 decode study's shape: the best median (#4, eleven flags) 0.5 % above #1 (two flags), both
    better than the defaults. The simpler one is exported, and the line says why; a simpler one outside
    the noise floor, or weaker by the verdict, or with a cost the best does not pay, is not."""
    s = _study()
    base = _trial(0, "baseline", tps=100)
    top = _flagged(4, 11, tps=175)
    simple = _flagged(1, 2, tps=174)
    rows = (_rows(base, [(100, 20), (101, 20), (99, 20)]) + _rows(top, [(175, 20), (176, 20), (174, 20)])
            + _rows(simple, [(174, 20), (175, 20), (173, 20)]))
    choice = export_choice(s, [base, top, simple], rows)
    assert choice.trial is simple
    assert choice.why.startswith("trial 1: median on capacity_tps over 3 repeats within 5% of the best (#4, x0.994) "
                                 "with 2 flags against 11: the simpler configuration, capacity_tps against the "
                                 "baseline: better")
    assert exported_trial(s, [base, top, simple], rows).trial is simple     # every output names the same one
    # 6 % below the best: outside the floor, the best median stays the export
    far = _flagged(1, 2, tps=164)
    rows_far = rows[:6] + _rows(far, [(164, 20), (165, 20), (163, 20)])
    assert export_choice(s, [base, top, far], rows_far).trial is top
    # as fast but worse on TPOT beyond noise (a cost the best does not pay): not as good
    slow = _flagged(1, 2, tps=174)
    rows_slow = rows[:6] + _rows(slow, [(174, 40), (175, 40), (173, 40)])
    assert export_choice(s, [base, top, slow], rows_slow).trial is top
    # the best gains nothing beyond noise and neither does the simpler one: still the simpler one
    flat = _flagged(4, 11, tps=102)
    plain = _flagged(1, 2, tps=101)
    rows_flat = (_rows(base, [(100, 20), (90, 20), (110, 20)]) + _rows(flat, [(102, 20), (92, 20), (112, 20)])
                 + _rows(plain, [(101, 20), (91, 20), (111, 20)]))
    assert export_choice(s, [base, flat, plain], rows_flat).trial is plain
    # the simpler one's first run peaked inside the study's headroom margin, the best's did not: the best
    # stays, and its line says why the simpler one was passed over (the H100 decode study: #1 at 1.8 % free)
    s.spec = {"telemetry": {"headroom_margin": 0.03}}
    simple.telemetry = {"source": "nvml", "peak_mem_used_mib": 78.2 * 1024, "mem_total_mib": 79.6 * 1024}
    top.telemetry = {"source": "nvml", "peak_mem_used_mib": 76.7 * 1024, "mem_total_mib": 79.6 * 1024}
    choice = export_choice(s, [base, top, simple], rows)
    assert choice.trial is top
    assert choice.why.endswith("capacity_tps against the baseline: better; #1 sets fewer flags within 5% of its "
                               "median but its first run's peak memory left less than the 3% headroom margin")
    top.telemetry = {"source": "nvml", "peak_mem_used_mib": 79.0 * 1024, "mem_total_mib": 79.6 * 1024}
    assert export_choice(s, [base, top, simple], rows).trial is simple     # both inside it: no reason left
    # the first runs both clear the margin, but a repeat of the simpler one (on a fresh server) did not:
    # every run counts, and the line names the run
    simple.telemetry = {"source": "nvml", "peak_mem_used_mib": 76.0 * 1024, "mem_total_mib": 79.6 * 1024}
    top.telemetry = {"source": "nvml", "peak_mem_used_mib": 76.7 * 1024, "mem_total_mib": 79.6 * 1024}
    assert export_choice(s, [base, top, simple], rows).trial is simple
    rows[7].telemetry = {"source": "nvml", "peak_mem_used_mib": 78.5 * 1024, "mem_total_mib": 79.6 * 1024}
    assert rows[7].trial_id == simple.id and rows[7].round == 1
    assert export_choice(s, [base, top, simple], rows).why.endswith(
        "#1 sets fewer flags within 5% of its median but its round-2 repeat's peak memory left less than the 3% "
        "headroom margin")
    confirmed = summarize_confirmations(s, [base, top, simple], rows)
    assert confirmed[1].least_headroom() == (pytest.approx(1 - 78.5 / 79.6), "round-2 repeat", 2)
    line = next(x for x in confirmation_lines(s, [base, top, simple], confirmed) if x.startswith("  #1 "))
    assert "; peak memory over 2 runs: least free 1.4% (round-2 repeat; LOW HEADROOM, margin 3%);" in line
    assert confirmed[0].least_headroom() is None          # the baseline measured no memory
    assert confirmed[1].to_json()["least_headroom"] == {"free": pytest.approx(1 - 78.5 / 79.6),
                                                        "run": "round-2 repeat", "runs": 2}


def test_an_unfinished_confirmation_says_what_its_rounds_left_can_decide():
    """The H100 chat study after its rounds 1, 2 and 4 (benchmarks/gpu/knobs/RESULTS.md, session 40), its
    capacity figures rounded: one round left for each candidate. #8 (x1.065, x1.083) comes out better at
    x1.034: the logs 0.0626, 0.0800, 0.0334 have mean 0.0587 and sd 0.0235, so with t(2) = 4.303 the interval
    starts at exp(0.0587 - 0.0584) = 1.0002, and its gain 6.0 % clears the larger median-gap spread (its
    own 5.1 %). At x1.033 the interval starts at 0.9986. The others cannot clear 1 with any third ratio."""
    from autotune.report.confirmed import confirmation_lines, pending_outlook

    s = StudyRecord(id=1, name="s", objectives=OBJ, spread_rule="gap", spec={"confirm": {"repeats": 3}})
    base, c3, c8 = _trial(0, "baseline", tps=2755), _trial(3, tps=2647), _trial(8, tps=2677)
    c11, c12 = _trial(11, tps=2604), _trial(12, tps=2703)
    rows = (_rows(base, [(2556, 11.0), (2390, 10.8), (2504, 10.6)], rounds=[0, 1, 3])
            + _rows(c3, [(2568, 11.4), (2579, 11.3)], rounds=[1, 3]) + _rows(c8, [(2721, 28.7), (2589, 37.3)])
            + _rows(c11, [(2550, 10.0), (2525, 10.5)]) + _rows(c12, [(2439, 9.1), (2449, 9.6)]))
    trials = [base, c3, c8, c11, c12]
    confirmed = summarize_confirmations(s, trials, rows)
    seen = {o.trial: o for o in pending_outlook(s, trials, confirmed)}
    assert sorted(seen) == [3, 8, 11, 12] and all(o.rounds_left == 1 for o in seen.values())
    assert seen[8].so_far == [1.065, 1.083] and seen[8].needed == pytest.approx(1.034)
    assert [seen[n].needed for n in (3, 11, 12)] == [None, None, None]
    # the threshold is the verdict's own: one step below it is not better
    pairs, b = [(2556, 2721), (2390, 2589)], 2504
    at = objective_verdict("capacity_tps", "maximize", pairs + [(b, b * 1.034)], [2556, 2390, 2504, b],
                           [2721, 2589, b * 1.034], "gap")
    below = objective_verdict("capacity_tps", "maximize", pairs + [(b, b * 1.033)], [2556, 2390, 2504, b],
                              [2721, 2589, b * 1.033], "gap")
    assert at.better and at.interval.low == pytest.approx(1.0002, abs=1e-4)
    assert not below.better and below.interval.low == pytest.approx(0.9986, abs=1e-4)
    said = confirmation_lines(s, trials, confirmed)[-1]
    assert said.startswith("what the rounds left can decide on capacity_tps, said before they run")
    assert "#8 (so far x1.065, x1.083) is better at x1.034 or more in its 1 round left" in said
    assert said.endswith("#3 (so far x1.074, x1.030), #11 (so far x0.998, x1.056), #12 (so far x0.954, x1.025) "
                         "cannot be better at any ratio up to x2")
    # once every round has run, nothing is said
    rows += _rows(base, [(2500, 10.9)], rounds=[2]) + [r for c in (c3, c8, c11, c12) for r in _rows(c, [(2500, 11.0)], rounds=[2])]
    done = summarize_confirmations(s, trials, rows)
    assert pending_outlook(s, trials, done) == [] and not confirmation_lines(s, trials, done)[-1].startswith("what the")


def test_the_outlook_of_a_minimized_objective_and_of_two_rounds_left():
    """A study whose first objective is minimized (p50 TPOT) asks for a ratio below 1; a candidate with one
    paired round has two left, each assumed at the same ratio."""
    from autotune.tuner.outlook import outlook

    s = StudyRecord(id=1, name="s", objectives=[["p50_tpot_ms", "minimize"], ["capacity_tps", "maximize"]],
                    spread_rule="gap", spec={"confirm": {"repeats": 3}})
    base, cand = _trial(0, "baseline"), _trial(1)
    rows = _rows(base, [(100, 20.0), (100, 20.4)]) + _rows(cand, [(100, 18.0)])
    confirmed = summarize_confirmations(s, [base, cand], rows)
    (o,) = outlook(s, confirmed, 0, 3)
    assert o.rounds_left == 2 and o.so_far == [0.9] and o.needed is not None and o.needed < 1.0
    b = 20.2
    v = objective_verdict("p50_tpot_ms", "minimize", [(20.0, 18.0)] + [(b, b * o.needed)] * 2, [20.0, 20.4, b, b],
                          [18.0, b * o.needed, b * o.needed], "gap")
    assert v.better
    # a study whose rounds are all run has no outlook
    assert outlook(s, confirmed, 0, 1) == []
