"""The capacity search's choice of loads, against synthetic latency curves (no server): it must bracket
and close in on the crossing within the step budget."""

import pytest

from autotune.bench.step_choice import StepSearch


def run(curve, integer, truth_check, max_steps=6, upper=1024.0, first=1.0):
    s = StepSearch(integer, upper, tolerance=0.03)
    load = first
    loads = []
    while load is not None and len(loads) < max_steps:
        m = curve(load)
        s.add(load, m, m <= 0)
        loads.append(load)
        load = s.next_load(final=len(loads) == max_steps - 1)
    lo, _ = s.bracket()
    return (lo[0] if lo else None), loads


def test_linear_tpot_curve_found_exactly():
    # TPOT = 5 + 0.5 n ms, limit 25.25 -> highest n meeting it is 40
    cap, loads = run(lambda n: (5 + 0.5 * n) / 25.25 - 1, True, None)
    assert cap == 40 and len(loads) <= 6


@pytest.mark.parametrize("scale", [3.0, 5.0, 30.0, 200.0])
def test_convex_curves_within_5_percent_in_6_steps(scale):
    # latency 1 + (x/scale)^2, limit 2: the crossing is at x = scale
    cap, loads = run(lambda x: min(4.0, (1 + (x / scale) ** 2) / 2 - 1), False, None)
    assert len(loads) <= 6
    assert scale * 0.95 <= cap <= scale


@pytest.mark.parametrize("knee", [3.0, 8.0, 20.0, 40.0, 80.0, 150.0])
def test_hockey_stick_never_overstates(knee):
    # flat-ish until a knee, then steep; a kinked curve is the search's hardest case: 6 steps get
    # within 25 %, and the answer is always a load that was measured to pass, never above the truth
    def curve(x):
        return min(4.0, (1 + 0.3 * x / knee + max(0.0, x - knee) * 3 / knee) / 1.5 - 1)
    truth = knee * 0.35 / 0.33
    cap, loads = run(curve, False, None)
    assert len(loads) <= 6
    assert truth * 0.75 <= cap <= truth


def test_broken_at_first_load_gives_none():
    cap, loads = run(lambda n: 0.5, True, None)
    assert cap is None and loads == [1.0]


def test_upper_bound_caps_the_search():
    cap, loads = run(lambda n: -0.5, True, None, upper=16)
    assert cap == 16 and loads[-1] == 16


def test_a_cut_short_failing_end_is_bisected_not_chorded():
    # a step cut short reports the margin of its first, fastest requests (here +10 %): the chord through
    # it would aim next to it (82); the log-midpoint of the bracket 12 .. 96 is 34
    s = StepSearch(True, 1024.0, tolerance=0.03)
    s.add(1, -0.9, True)
    s.add(12, -0.5, True)
    s.add(96, 0.1, False, cut_short=True)
    assert s.next_load() == 34
    full = StepSearch(True, 1024.0, tolerance=0.03)
    full.add(1, -0.9, True)
    full.add(12, -0.5, True)
    full.add(96, 0.1, False)
    assert full.next_load() > 70
