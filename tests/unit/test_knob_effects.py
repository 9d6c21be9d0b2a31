"""Per-knob effects for the user (report/effects.py): from measured trials only, a direction and a size
with the trials they rest on, and "too few trials" below the threshold."""

from __future__ import annotations

from types import SimpleNamespace

from autotune.report.effects import MIN_GROUP, TOO_FEW, effect_rows, knob_effects

STUDY = SimpleNamespace(objectives=[["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]])


def _t(number, params, tps=None, tpot=None, state="ok", role="search"):
    objectives = {} if tps is None else {"capacity_tps": tps, "p50_tpot_ms": tpot}
    return SimpleNamespace(number=number, role=role, state=state, params=params, objectives=objectives)


def _by(effects, knob, objective):
    return next(e for e in effects if e.knob == knob and e.objective == objective)


def test_a_switch_gets_its_direction_and_size_against_the_baselines_value():
    trials = [_t(0, {"prefix": True, "seqs": 64}, 100, 10, role="baseline")]
    # seqs spread across both sides of prefix (a knob split like prefix would be named beside it)
    trials += [_t(i, {"prefix": True, "seqs": 64 + i * 5 % 8}, 100 + i, 10) for i in range(1, 4)]
    trials += [_t(i, {"prefix": False, "seqs": 64 + i * 5 % 8}, 150 + i, 12) for i in range(4, 8)]
    # failures and placeholders never count: a failed trial has no measured values
    trials += [_t(8, {"prefix": False, "seqs": 999}, state="failed"), _t(9, {"prefix": False}, 1e9, 0.1, state="failed")]
    effects = knob_effects(STUDY, trials)
    tps = _by(effects, "prefix", "capacity_tps")
    assert tps.reference.label == "on" and tps.reference.n == 4 and tps.best.label == "off" and tps.best.n == 4
    assert tps.n == 8 and tps.helps is True
    assert abs(tps.ratio - 155.5 / 101.5) < 1e-9
    assert tps.text() == "off -> x1.53 (better) vs on, 4 vs 4 trials"
    tpot = _by(effects, "prefix", "p50_tpot_ms")       # minimize: off raised the median TPOT 10 -> 12 ms
    assert tpot.best.label == "off" and tpot.ratio == 1.2 and tpot.helps is False
    assert tpot.text() == "off -> x1.2 (worse) vs on, 4 vs 4 trials"


def test_a_knob_with_many_values_is_split_at_its_median():
    trials = [_t(i, {"gmu": 0.80 + 0.01 * i}, 100 + (50 if i >= 5 else 0), 10) for i in range(10)]
    e = _by(knob_effects(STUDY, trials), "gmu", "capacity_tps")
    assert e.best.label.startswith(">") and e.reference.label.startswith("<=")
    assert e.ratio == 1.5 and e.text().startswith("higher -> x1.5 (better), 5 vs 5 trials")


def test_few_trials_say_so_instead_of_a_number():
    trials = [_t(0, {"prefix": True}, 100, 10, role="baseline"), _t(1, {"prefix": False}, 300, 10),
              _t(2, {"prefix": False}, 310, 10), _t(3, {"prefix": True}, 110, 10)]
    e = _by(knob_effects(STUDY, trials), "prefix", "capacity_tps")
    assert e.too_few and e.ratio is None and e.text() == f"{TOO_FEW} (4)"
    # enough trials in all but too few on one side
    lopsided = [_t(i, {"prefix": i > 0}, 100 + i, 10) for i in range(8)]
    e = _by(knob_effects(STUDY, lopsided), "prefix", "capacity_tps")
    assert e.reference.n == 7 and e.groups[0].n == 1 < MIN_GROUP and e.too_few


def test_knobs_that_never_moved_are_left_out_and_rows_carry_importance():
    trials = [_t(i, {"fixed": 1, "prefix": i % 2 == 0}, 100 + 10 * (i % 2), 10) for i in range(8)]
    effects = knob_effects(STUDY, trials, {"capacity_tps": {"prefix": 0.8}})
    assert {e.knob for e in effects} == {"prefix"}
    rows = effect_rows(effects, ["capacity_tps", "p50_tpot_ms"])
    assert rows[0][:3] == ["prefix", "8", "0.80"] and "trials" in rows[0][3]


def test_two_knobs_that_split_the_trials_alike_name_each_other():
    # chunked prefill and async scheduling were off in the same three trials (as in the H200 long-prompt
    # study): their two figures are one association, and each says so; a knob split differently does not
    trials = [_t(i, {"chunked": i >= 3, "async": i >= 3, "prefix": i % 2 == 0}, 100 + 10 * (i >= 3), 10)
              for i in range(8)]
    effects = knob_effects(STUDY, trials)
    chunked, async_ = _by(effects, "chunked", "capacity_tps"), _by(effects, "async", "capacity_tps")
    assert chunked.same_split == ["async"] and async_.same_split == ["chunked"]
    assert chunked.ratio == async_.ratio and chunked.best.trials == [0, 1, 2]
    assert chunked.reference.trials == [3, 4, 5, 6, 7]
    assert chunked.text() == "off -> x0.909 (worse) vs on, 3 vs 5 trials; the same trials as async: not told apart"
    prefix = _by(effects, "prefix", "capacity_tps")
    assert prefix.same_split == [] and "not told apart" not in prefix.text()
    # the same split either way round (one knob on where the other is off) is the same association
    flipped = [_t(i, {"chunked": i >= 3, "eager": i < 3}, 100 + 10 * (i >= 3), 10) for i in range(8)]
    assert _by(knob_effects(STUDY, flipped), "chunked", "capacity_tps").same_split == ["eager"]


def test_a_knob_that_moved_with_another_names_it_with_its_medians_on_each_side():
    """The H100 decode study's async scheduling (benchmarks/gpu/knobs, session 26): off read x0.431 capacity
    tok/s, but its off trials had small max-num-seqs and its on trials (bar one) large ones. The effect
    names max_num_seqs and its medians on each side; a knob spread over both sides is not named."""
    seqs_on, seqs_off = [1024, 266, 561, 65], [174, 16, 56, 63, 158]
    tps_on, tps_off = [16636, 14098, 17336, 5434], [12333, 2097, 6373, 6626, 11867]
    trials = [_t(0, {"async": True, "seqs": 1024, "stream": 1}, 16636, 18.5, role="baseline")]
    trials += [_t(i, {"async": True, "seqs": s, "stream": 1 + i % 2}, y, 18) for i, s, y in
               zip(range(1, 4), seqs_on[1:], tps_on[1:])]
    trials += [_t(i, {"async": False, "seqs": s, "stream": 1 + i % 2}, y, 9) for i, s, y in
               zip(range(4, 9), seqs_off, tps_off)]
    e = _by(knob_effects(STUDY, trials), "async", "capacity_tps")
    assert (e.reference.label, e.best.label, round(e.ratio, 3)) == ("on", "off", 0.431)
    assert [a.knob for a in e.moved_along] == ["seqs"]          # 18 of 20 cross pairs ordered one way
    assert (e.moved_along[0].best, e.moved_along[0].reference, e.moved_along[0].separation) == ("63", "414", 0.9)
    assert e.text().endswith("; seqs 63 vs 414 moved with it: not told apart")
    # not symmetric: seqs splits at its median (158), and each side holds one trial of the other async
    # value, so async is ordered one way in 15.5 of 20 pairs there (0.775): not named
    seqs = _by(knob_effects(STUDY, trials), "seqs", "capacity_tps")
    assert seqs.best.trials == [0, 1, 2, 4] and seqs.moved_along == []
    # a switch that moved along is counted as on/off: 5/5 on above the median, 1/5 below (0.9 of pairs)
    trials = [_t(i, {"gmu": 0.80 + 0.01 * i, "chunked": i >= 5 or i == 0}, 100 + 10 * i, 10) for i in range(10)]
    e = _by(knob_effects(STUDY, trials), "gmu", "capacity_tps")
    assert [(a.knob, a.best, a.reference, a.separation) for a in e.moved_along] == [("chunked", "5/5 on", "1/5 on", 0.9)]
