"""The capacity search's steps against stand-in servers whose capacity is known in closed form (no HTTP):
a met step's evidence (its TTFT against the SLO, its throughput, the server's max-num-seqs or KV-cache
size) bounds the next step's growth, so a long-prompt search stops leaping past the point where requests
start to queue, while short-prompt searches keep their brackets and answers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from autotune.bench.step_bounds import ServerLimits, StepEvidence, ceiling
from autotune.bench.step_choice import BELOW_HINT, DESCENT, MARGIN_CAP, MAX_BELOW, StepSearch, is_wide, step_plan

CUT = 0.5      # a step this far over a limit is cut short (bench/abort.py ends such a step within a wave)


@dataclass
class ClosedLoop:
    """A continuous-batching server under `c` closed-loop streams, in closed form. At most `slots` run (its
    max-num-seqs, or the requests its KV cache holds); the rest wait. TPOT rises with the batch and
    levels off (prefill chunks share the steps); TTFT is the prompt's prefill, a little slower in a
    bigger batch, plus the wait for a slot: by Little's law each waiting stream adds 1/X."""

    slots: int
    prefill_ms: float = 170.0        # several thousand tokens in
    tpot_ms: float = 7.0             # one stream's TPOT
    tpot_rise_ms: float = 30.0       # how far TPOT rises with the batch before it levels off
    output: int = 256
    prompt: int = 6000
    ttft_limit: float = 1000.0
    tpot_limit: float = 50.0

    def at(self, c: float) -> StepEvidence:
        b = min(c, self.slots)
        tpot = self.tpot_ms + self.tpot_rise_ms * (1 - math.exp(-(b - 1) / 4))
        prefill = self.prefill_ms * (1 + 0.02 * b)
        rate = b / (prefill + self.output * tpot) * 1000.0           # requests/s
        ttft = prefill + (c - b) / rate * 1000.0
        return StepEvidence({"ttft:p99": ("ttft", ttft, self.ttft_limit),
                             "tpot:p50": ("tpot", tpot, self.tpot_limit)}, rate, c, self.prompt + self.output)

    def capacity(self) -> int:
        c = 1
        while margin(self.at(c + 1)) <= 0:
            c += 1
        return c


@dataclass
class ShortPrompts:
    """Short prompts, many slots: TPOT = 5 + 0.5 x streams (the mock server's batch model), TTFT small and
    rising gently with the batch; the TPOT limit is met up to `capacity`."""

    capacity_streams: int
    slots: int = 1024

    def at(self, c: float) -> StepEvidence:
        tpot = 5 + 0.5 * c
        ttft = 20 + 3 * c
        rate = c / (ttft + 127 * tpot) * 1000.0
        return StepEvidence({"ttft:p99": ("ttft", ttft, 1000.0),
                             "tpot:p50": ("tpot", tpot, 5 + 0.5 * (self.capacity_streams + 0.5))}, rate, c, 1024 + 128)

    def capacity(self) -> int:
        return self.capacity_streams


def margin(ev: StepEvidence) -> float:
    return min(MARGIN_CAP, max(ev.margins().values()))


def search(server, limits: ServerLimits | None, *, evidence: bool = True,
           hint: tuple[float, float | None] | None = None, max_steps: int = 6,
           below_hint: float | None = BELOW_HINT, descent: float | None = DESCENT
           ) -> tuple[list[tuple[int, bool]], StepSearch]:
    """The steps find_capacity takes (step_plan), each measured on the stand-in."""
    s = StepSearch(True, 1024.0, 0.03, hinted=hint is not None, expect_broken=hint[1] if hint else None,
                   limits=limits)
    plan = step_plan(s, hint[0] if hint else 1.0, probe=hint is None, max_steps=max_steps, below_hint=below_hint,
                     descent=descent)
    load, _ = next(plan)
    steps: list[tuple[int, bool]] = []
    while True:
        ev = server.at(load)
        m = margin(ev)
        s.add(load, m, m <= 0, cut_short=m > CUT, evidence=ev if evidence else None)
        steps.append((int(load), m <= 0))
        try:
            load, _ = plan.send(m <= 0)
        except StopIteration:
            return steps, s


def broken(steps: list[tuple[int, bool]]) -> int:
    return sum(1 for _, met in steps if not met)


def test_the_h200_long_prompt_trial_no_longer_leaps_past_its_max_num_seqs():
    # the trial: long prompts, a TPOT bound, max-num-seqs 20; TPOT barely moves from 12 to 18
    # streams, so the line through them crossed its limit far away (the H200 stepped 1, 12, 18, then
    # 77, 37, 26, 22, four broken). The stand-in reproduces that sequence with the old search.
    server = ClosedLoop(slots=20)
    assert server.capacity() == 21
    before, old = search(server, None, evidence=False)
    assert [x for x, _ in before[:4]] == [1, 12, 18, 72] and broken(before) == 3
    assert old.bracket()[1][0] - old.bracket()[0][0] > 1           # ... and still ended with a loose bracket
    after, new = search(server, ServerLimits.from_flags(["--max-num-seqs", "20"], None))
    assert after == [(1, True), (12, True), (18, True), (20, True), (21, True), (22, False)]
    lo, hi = new.bracket()
    assert (lo[0], hi[0]) == (21, 22)                               # the exact capacity, adjacent ends


def test_the_kv_cache_size_the_server_logged_bounds_it_too():
    # no max-num-seqs in the flags: the KV cache holds 20 requests of 6,256 tokens
    server = ClosedLoop(slots=20)
    after, new = search(server, ServerLimits.from_flags([], 20 * 6256 + 100))
    assert broken(after) == 1 and new.bracket()[0][0] == server.capacity()


@pytest.mark.parametrize("slots", [8, 16, 24, 40, 64])
def test_long_prompt_searches_break_the_slo_at_most_twice_and_find_the_truth(slots):
    server = ClosedLoop(slots=slots, prefill_ms=250.0)
    before, _ = search(server, None, evidence=False)
    after, s = search(server, ServerLimits(max_seqs=slots))
    assert broken(after) <= 2 and broken(after) <= broken(before)
    lo, hi = s.bracket()
    assert lo[0] == server.capacity() and hi is not None and hi[0] - lo[0] <= 1


def test_data_parallel_ranks_multiply_the_slots():
    assert ServerLimits.from_flags(["--max-num-seqs", "16", "--data-parallel-size", "2"], 1000) == \
        ServerLimits(max_seqs=32, kv_tokens=2000)
    assert ServerLimits.from_flags(["--max-num-seqs", "x"], None) == ServerLimits()


@pytest.mark.parametrize("truth", [12, 40, 90, 300])
@pytest.mark.parametrize("hinted", [False, True])
def test_short_prompt_searches_keep_their_answer_and_bracket(truth, hinted):
    server = ShortPrompts(truth)
    hint = (truth * 0.8, truth * 1.1) if hinted else None
    before, old = search(server, None, evidence=False, hint=hint)
    after, new = search(server, ServerLimits(max_seqs=1024, kv_tokens=10**7), hint=hint)
    assert new.bracket()[0][0] == old.bracket()[0][0]                          # the same answer ...
    assert truth * 0.97 <= new.bracket()[0][0] <= truth                        # ... within the 3 % tolerance
    assert not is_wide(new.bracket(), True, 1024.0, 0.25)
    assert len(after) <= len(before) and broken(after) <= broken(before)


@pytest.mark.parametrize("truth, hint", [(23, 29), (21, 26), (40, 48)])
def test_a_hint_a_little_above_the_capacity_steps_down_instead_of_probing(truth, hint):
    # the H200 long-prompt study's trials 2 and 3: the hint broke at 29 and 26, the capacities were 23 and
    # 21, and the probe's climb from one stream took 5 more steps
    server, limits = ShortPrompts(truth), ServerLimits(max_seqs=1024, kv_tokens=10**7)
    before, old = search(server, limits, hint=(hint, None), below_hint=None)
    after, new = search(server, limits, hint=(hint, None))
    assert before[:2] == [(hint, False), (1, True)]                          # the search before: the probe
    assert after[:2] == [(hint, False), (int(hint * 0.75), True)] and all(x != 1 for x, _ in after)
    assert truth * 0.97 <= new.bracket()[0][0] <= truth and not is_wide(new.bracket(), True, 1024.0, 0.25)
    assert len(after) <= len(before) and broken(after) <= broken(before)
    if hint / truth > 1.22:     # the H200's two: one step fewer besides the probe (here the probe's climb
        assert len(after) < len(before)     # extrapolates well; on the H200 the cut-short break made it bisect)


def test_a_hint_far_above_the_capacity_steps_down_by_halves_before_the_probe():
    server, limits = ShortPrompts(12), ServerLimits(max_seqs=1024, kv_tokens=10**7)
    after, new = search(server, limits, hint=(48, None))
    before, old = search(server, limits, hint=(48, None), descent=None)
    assert after[:4] == [(48, False), (36, False), (18, False), (9, True)]
    assert before[:3] == [(48, False), (36, False), (1, True)]
    # the same answer in one step less: the bracket (9, 18) instead of (1, 36) from the probe
    assert new.bracket()[0][0] == old.bracket()[0][0] == 12 and len(after) == len(before) - 1
    # the steps below cost none of the budget: a tight one keeps its answer
    for max_steps in (3, 4):
        short, s_new = search(server, limits, hint=(48, None), max_steps=max_steps)
        assert short[:4] == [(48, False), (36, False), (18, False), (9, True)] and s_new.bracket()[0][0] == 12
    # further below than MAX_BELOW steps reach: the probe at one stream, then the search as before
    far, f = search(ShortPrompts(3), limits, hint=(48, None))
    assert far[:MAX_BELOW + 2] == [(48, False), (36, False), (18, False), (9, False), (1, True)]
    assert f.bracket()[0][0] == 3


def test_an_slo_without_a_wait_term_sets_no_bound():
    # queueing for a slot adds to TTFT and E2EL only: a TPOT-only SLO is not broken by it
    ev = StepEvidence({"tpot:p50": ("tpot", 30.0, 50.0)}, 2.0, 18, 6256)
    assert ceiling(18, ev, [], ServerLimits(max_seqs=20), True) is None


def test_a_saturated_server_grows_by_the_wait_its_ttft_has_left():
    # throughput flat from 16 to 24 streams: each added stream waits 1/X = 200 ms more; 600 ms left
    below = [(16.0, StepEvidence({"ttft:p99": ("ttft", 300.0, 1000.0)}, 5.0, 16, 6256))]
    ev = StepEvidence({"ttft:p99": ("ttft", 400.0, 1000.0)}, 5.05, 24, 6256)
    assert ceiling(24, ev, below, None, True) == 27
    # still scaling (throughput +40 % for +50 % load): no bound from queueing
    grew = StepEvidence({"ttft:p99": ("ttft", 400.0, 1000.0)}, 7.0, 24, 6256)
    assert ceiling(24, grew, below, None, True) is None
    # the single-stream probe is no reference: from one stream throughput always grows slower than load
    probe = [(1.0, StepEvidence({"ttft:p99": ("ttft", 170.0, 1000.0)}, 0.9, 1, 6256))]
    assert ceiling(24, grew, probe, None, True) is None


def test_a_rate_search_stops_at_the_rate_that_fills_the_slots():
    # 4 req/s held 10 requests in flight (Little): 20 slots fill near 8 req/s
    ev = StepEvidence({"ttft:p99": ("ttft", 300.0, 1000.0)}, 4.0, 10.0, 6256)
    assert ceiling(4.0, ev, [], ServerLimits(max_seqs=20), False) == pytest.approx(8.0)
