"""The capacity search bounded by the server's own limit, over real HTTP: the mock server batches at most
8 streams (its max-num-seqs) and queues the rest, so a stream beyond 8 waits a whole request (64 steps
of 5 ms) for its first token and breaks a 200 ms TTFT limit. Told the limit, the search measures 8 and then 9;
without it, it overshoots from its probe and has to come back."""

from __future__ import annotations

from autotune.bench import find_capacity, parse_workload
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.bench.step_bounds import ServerLimits
from autotune.slo import SLO

W = parse_workload("random:input_len=20,output_len=64")
TTFT = SLO.parse("ttft:p99<=200ms")


async def test_the_search_steps_to_max_num_seqs_and_one_stream_past_it() -> None:
    async with serve(build_app(MockConfig(mode="batch", step_ms=3, per_seq_ms=0.25, max_seqs=8))) as url:
        told = await find_capacity(url, "mock", W, TTFT, requests_per_step=8, warmup=2,
                                   limits=ServerLimits.from_flags(["--max-num-seqs", "8"], None))
        blind = await find_capacity(url, "mock", W, TTFT, requests_per_step=8, warmup=2)
    assert [s.load for s in told.steps] == [1, 8, 9]
    assert told.bracket == (8, 9) and told.capacity == 8
    assert [s.slo_met for s in told.steps] == [True, True, False]
    broken = sum(1 for s in blind.steps if not s.slo_met)
    assert blind.capacity == 8 and broken >= 1 and len(blind.steps) > len(told.steps)
