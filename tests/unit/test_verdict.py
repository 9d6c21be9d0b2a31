"""The verdict's arithmetic with numbers worked by hand, and the export choice: confirmed medians win, a
candidate leaves the front on a failed repeat or a median below its bracket, and a trial carrying a
measurement flag is never exported unconfirmed."""

from __future__ import annotations

import math

import pytest

from autotune.bench import measurement_flags as mflags
from autotune.report.confirmed import confirmation_lines, export_header
from autotune.store.models import ConfirmationRecord, StudyRecord, TrialRecord
from autotune.tuner.confirm import pick_candidates, plan, round_seed
from autotune.tuner.verdict import (export_choice, objective_verdict, paired_ratio_interval, relative_spread,
                                    summarize_confirmations, t975, unconfirmed_flagged)

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


def _study(quality=()):
    return StudyRecord(id=1, name="s", objectives=OBJ, quality_knobs=list(quality))


def _trial(i, role="search", cap=10.0, tps=100.0, tpot=20.0, flags=None, params=None, bracket=None):
    return TrialRecord(id=100 + i, number=i, role=role, state="ok", objectives={"capacity_tps": tps, "p50_tpot_ms": tpot},
                       constraints={"slo:ttft:p99": -5.0, "failure": 0.0}, metrics={}, params=params or {"x": i},
                       flags=[f"--x={i}"] if role != "baseline" else [],
                       capacity={"capacity": cap, "bracket": bracket or [cap, cap + 1]}, measurement_flags=flags)


def _rows(trial, values, caps=None, states=None):
    out = []
    for r, (tps, tpot) in enumerate(values):
        state = (states or ["ok"] * len(values))[r]
        out.append(ConfirmationRecord(trial_id=trial.id, round=r, position=0, seed=r, state=state,
                                      cause="crash" if state == "failed" else None,
                                      objectives={} if state == "failed" else {"capacity_tps": tps, "p50_tpot_ms": tpot},
                                      capacity={"capacity": (caps or [trial.capacity["capacity"]] * 3)[r]}))
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


def test_a_candidate_leaves_the_front_on_a_failed_repeat_or_a_median_below_its_bracket():
    s = _study()
    base = _trial(0, "baseline", cap=8, tps=100)
    crashed = _trial(1, cap=10, tps=200)
    flattered = _trial(2, cap=12, tps=190, bracket=[12, 13])
    rows = (_rows(base, [(100, 20)] * 3)
            + _rows(crashed, [(200, 20), (0, 0), (200, 20)], states=["ok", "failed", "ok"])
            + _rows(flattered, [(150, 20)] * 3, caps=[9, 10, 13]))
    confirmed = summarize_confirmations(s, [base, crashed, flattered], rows)
    assert not confirmed[1].survives and "repeat 2 failed (crash)" in confirmed[1].why_not
    assert not confirmed[2].survives and "median capacity 10 below the first run's bracket (12)" in confirmed[2].why_not
    assert export_choice(s, [base, crashed, flattered], rows).trial is base
    # when nothing survives, nothing is exported, with the reasons in one line
    rows = _rows(crashed, [(200, 20), (0, 0), (200, 20)], states=["ok", "failed", "ok"])
    choice = export_choice(s, [base, crashed], rows)
    assert choice.trial is None and choice.why.startswith("no candidate survived confirmation") and "\n" not in choice.why


def test_show_and_the_export_header_give_one_verdict_when_the_baseline_left_the_front():
    """As `make run` showed on the loaded box: the baseline's repeats fell below its first run's bracket and
    it left the front; a candidate survived with a lower median. `show` used to say "no verdict" while the
    export's header stated the paired one."""
    s = _study()
    base = _trial(0, "baseline", cap=55, tps=2026, bracket=[55, 224])
    cand = _trial(1, cap=6, tps=295, bracket=[6, 12])
    rows = _rows(base, [(935, 5), (900, 4), (1000, 6)], caps=[16, 15, 20]) + _rows(cand, [(589, 1), (560, 1), (600, 1)])
    confirmed = summarize_confirmations(s, [base, cand], rows)
    assert not confirmed[0].survives and confirmed[1].survives
    choice = export_choice(s, [base, cand], rows)
    assert choice.trial is cand
    header = export_header(s, [base, cand], confirmed, choice)
    shown = confirmation_lines(s, [base, cand], confirmed)
    verdict = "; ".join(v.text() for v in confirmed[1].verdicts)
    assert "worse" in verdict or "no gain" in verdict
    assert f"against the baseline: {verdict}" in header
    assert any(line.endswith(verdict) and "#1 against the baseline #0" in line for line in shown)
    assert any("the baseline #0 left the front (median capacity 16 below" in line for line in shown)
    assert not any("no confirmed baseline" in line for line in shown)


def test_show_gives_the_paired_rounds_when_nothing_survived():
    """The H200 confirmation of the FP8 study: every configuration's repeats fell below its first run, yet
    FP8 beat the defaults in each round. `show` says nothing is exported and what the rounds measured."""
    s = _study(quality=["quantization"])
    base = _trial(0, "baseline", cap=40, tps=2785, bracket=[40, 41], params={"quantization": "none"})
    fp8 = _trial(2, "enqueued", cap=58, tps=4824, bracket=[58, 59], params={"quantization": "fp8"})
    rows = (_rows(base, [(2577, 8.4), (2671, 9.4), (2699, 9.3)], caps=[34, 39, 39])
            + _rows(fp8, [(3706, 8.7), (4045, 7.8), (3375, 9.0)], caps=[49, 49, 47]))
    confirmed = summarize_confirmations(s, [base, fp8], rows)
    assert not confirmed[0].survives and not confirmed[2].survives
    shown = confirmation_lines(s, [base, fp8], confirmed)
    assert "NOTHING SURVIVED CONFIRMATION: no configuration is exported" in shown
    paired = [line for line in shown if "measured in the paired rounds, not exported: #2 against the baseline #0" in line]
    assert len(paired) == 1 and "capacity_tps x1.396 [1.092, 1.786] over 3 paired rounds, spread 18.1%: better" in paired[0]
    assert export_choice(s, [base, fp8], rows).trial is None


def test_candidates_plan_and_seeds():
    s = _study(quality=["kv_cache_dtype"])
    base = _trial(0, "baseline", tps=100, params={"kv_cache_dtype": "auto"})
    fp8 = _trial(1, tps=180, tpot=30, params={"kv_cache_dtype": "fp8"})
    plain = _trial(2, tps=120, tpot=25, params={"kv_cache_dtype": "auto"})
    fast = _trial(3, tps=110, tpot=15, params={"kv_cache_dtype": "auto"})
    picked = pick_candidates(s, [base, fp8, plain, fast], k=3)
    # best overall (quality-changing), then the best output-preserving, then the rest of the front
    assert [t.number for t in picked] == [1, 2, 3]
    assert [t.number for t in pick_candidates(s, [base, fp8, plain, fast], k=1)] == [1]
    order = [(r, t.number) for r, _, t in plan(base, [fp8, plain], 3)]
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
