"""Steady steps and the capacity bracket against the mock server (known service model, real HTTP):
the first wave is kept out of the figures and reported apart, a step counts at least W waves, the result
carries its bracket, a wide bracket is refined or flagged, each step's JSON keeps its numeric load, and
`bench` resets the prefix cache and marks a flattered run."""

from __future__ import annotations

import asyncio
import json

import pytest

from autotune.bench import find_capacity, parse_workload, run_load
from autotune.bench.capacity import is_wide
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.slo import SLO

W = parse_workload("random:input_len=20,output_len=16")
TPOT = SLO.parse("tpot:p50<=12.125ms")   # TPOT = 2 + 0.25 x batch ms: the highest concurrency meeting it is 40


def mock(**kw):
    return serve(build_app(MockConfig(**kw)))


async def test_the_first_wave_is_sent_under_load_but_kept_out_of_the_figures():
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25, max_seqs=4) as url:
        m = await run_load(url, "mock", W, concurrency=8, num_requests=24, settle=8, slo=TPOT)
        plain = await run_load(url, "mock", W, concurrency=8, num_requests=24, slo=TPOT)
    assert len(m.first_wave) == 8 and len(m.records) == 24 and m.metrics["completed"] == 24
    # the first wave are the first 8 dispatched; every counted request left after them
    assert max(r.start_s for r in m.first_wave) <= min(r.start_s for r in m.records)
    wave = m.first_wave_summary()
    assert wave["requests"] == 8 and wave["failed"] == 0 and wave["p99_ttft_ms"] > 0
    assert m.load["settle"] == 8 and plain.load["settle"] == 0 and not plain.first_wave
    assert m.to_json(with_records=False)["first_wave"]["requests"] == 8


async def test_each_step_counts_w_waves_and_the_result_carries_its_bracket():
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
        r = await find_capacity(url, "mock", W, TPOT, requests_per_step=20, warmup=2, min_waves=3)
    for s in r.steps[1:]:
        if not s.measurement.aborted_early:
            c = int(s.load)
            assert s.measurement.metrics["completed"] >= 3 * c and len(s.measurement.first_wave) == c
    lo, hi = r.bracket
    # 40 on a quiet box; the mock shares the client's cores, and scheduling delay only ever adds to TPOT,
    # so a loaded box measures lower (34 seen in CI on two busy cores; lower still when the client flags
    # itself saturated), never higher
    assert lo == r.capacity and lo <= 41 and (28 <= lo or "client_saturated" in r.flags)
    assert hi == min(s.load for s in r.steps if not s.slo_met)
    # the JSON keeps every step's numeric load; what the measurement offered sits beside it
    doc = json.loads(json.dumps(r.to_json()))
    assert [s["load"] for s in doc["steps"]] == [s.load for s in r.steps]
    assert all(isinstance(s["load"], float) and s["offered"]["concurrency"] == s["load"] for s in doc["steps"])
    assert doc["bracket"] == [lo, hi]


async def test_a_wide_bracket_is_flagged_when_no_step_is_left_to_refine_it():
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
        r = await find_capacity(url, "mock", W, TPOT, requests_per_step=20, warmup=2, max_steps=2,
                                refine_steps=0, min_waves=1)
    assert len(r.steps) == 2 and r.bracket[1] is None           # passed twice, never broke: a lower bound
    assert "wide_bracket" in r.flags and "wide bracket" in r.note and r.capacity < 36


async def test_refinement_spends_extra_steps_until_the_bracket_is_narrow():
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
        r = await find_capacity(url, "mock", W, TPOT, requests_per_step=20, warmup=2, max_steps=2,
                                refine_steps=4, min_waves=1)
    assert 2 < len(r.steps) <= 6
    lo, hi = r.bracket
    wide = is_wide(((lo, 0.0), (hi, 0.0) if hi is not None else None), True, 1024, 0.25)
    assert ("wide_bracket" in r.flags) == wide
    if not wide:
        assert hi is not None and (hi - lo) / lo <= 0.25 and lo <= 44
        assert 30 <= lo or "client_saturated" in r.flags      # the truth, 40, under a loaded machine's noise


async def test_a_load_to_check_inside_the_bracket_gets_one_more_step_and_settles_it():
    """A confirmation repeat checks its first run's highest met load: a coarse search must not read as
    'below the first run' only because it ended with that load inside its bracket."""
    coarse = dict(requests_per_step=20, warmup=2, max_steps=3, refine_steps=0, min_waves=1, max_bracket=10.0)
    async with mock(mode="batch", step_ms=2, per_seq_ms=0.25) as url:
        r = await find_capacity(url, "mock", W, TPOT, check=30, **coarse)
        below = await find_capacity(url, "mock", W, TPOT, check=1, **coarse)
    loads = [s.load for s in r.steps]
    # three steps end coarse (1, ~11 met, ~44 broken: the truth is 40), with 30 inside; a fourth settles it.
    # A busy machine (the client flags itself saturated) reads a lower crossing: then the rule itself, on
    # what the three steps measured: a fourth step at 30 exactly when 30 lies inside their bracket
    coarse_met = max((s.load for s in r.steps[:3] if s.slo_met), default=None)
    coarse_broken = min((s.load for s in r.steps[:3] if not s.slo_met), default=None)
    inside = coarse_met is not None and coarse_met < 30 and (coarse_broken is None or 30 < coarse_broken)
    assert (len(loads), loads[-1] == 30) == ((4, True) if inside else (3, False)), loads
    if inside:
        assert 30 in r.bracket and (r.capacity == 30) == r.steps[-1].slo_met
    # 30 is outside the coarse bracket only when the client was starved, or when the third step landed at or
    # below the truth and met it (seen quiet, in make test-fast: 1, 11, 40 met: growth follows measured latency)
    assert inside or "client_saturated" in r.flags or 30 <= (coarse_met or 0) <= 40, loads
    assert len(below.steps) == 3                       # a load at or below the bracket is settled already


def test_is_wide():
    assert is_wide(((27, -0.1), (81, 0.5)), True, 1024, 0.25)         # the 27 .. 81
    assert not is_wide(((40, -0.1), (41, 0.1)), True, 1024, 0.25)     # adjacent integers
    assert not is_wide(((10, -0.1), (12, 0.1)), False, 1e9, 0.25)
    assert is_wide(((10, -0.5), None), True, 1024, 0.25)              # never broke below the cap
    assert not is_wide(((16, -0.5), None), True, 16, 0.25)            # passed at the cap itself
    assert not is_wide((None, (1, 0.3)), True, 1024, 0.25)


def test_bench_resets_the_cache_and_marks_a_flattered_run(mock_in_thread, monkeypatch, capsys, tmp_path):
    import urllib.request

    import autotune.bench.runner as runner
    from autotune.bench.command import main

    monkeypatch.setattr(runner, "prefix_hit_pct", lambda before, after: 40.0)   # as if the cache served 40 %
    out = tmp_path / "r.json"
    code = main(["--url", mock_in_thread, "--model", "mock", "--concurrency", "4", "--num-requests", "12",
                 "--workload", "random:input_len=8,output_len=8", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "FLATTERED" in text and "40.0 %" in text
    data = json.loads(out.read_text())
    # (and client_saturated, when the busy machine starved the client: its own flag, not this test's)
    assert "prefix_hits" in data["measurement_flags"] and data["load"]["cache_reset"] is True
    assert set(data["measurement_flags"]) <= {"prefix_hits", "client_saturated"}
    with urllib.request.urlopen(mock_in_thread + "/mock/resets") as resp:
        assert json.load(resp) == [True]                    # reset once, before the run
