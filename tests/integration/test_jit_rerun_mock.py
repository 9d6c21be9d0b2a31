"""A step during which the server JIT-compiled a kernel is re-run, against the mock server (real HTTP on
loopback) whose batch model stalls once, as a compile would, when its batch first grows large, and
writes vLLM's JIT-monitor warning into its log: the search re-runs that step and uses the re-run; a
re-run that compiles again is kept and the result flagged `jit_compile`."""

from __future__ import annotations

from pathlib import Path

from autotune.bench import find_capacity, parse_workload
from autotune.bench.mockserver import MockConfig, build_app, serve
from autotune.engine.logwatch import JitWatch
from autotune.slo import SLO

# lengths 8..24 tokens: requests end at different steps, so the batch never drains between waves (which
# would re-arm the "compile" and restart its count of steps) however late a busy client sends the next
W = parse_workload("random:input_len=20,output_len=16,range_ratio=0.5")
# TPOT = 2 + 0.25 x batch ms: 9.5 ms at 30 streams, and the highest concurrency meeting the limit is 112. The
# limit leaves 20 ms for a busy machine's delays (its event loop runs the mock beside the client), which the
# compile's stall does not: it adds 1000 / 23 ms or more to the TPOT of every request it holds up
TPOT = SLO.parse("tpot:p99<=30ms")
# a 1 s "compile" once a batch of >= 12 has run 20 steps: past the first wave, inside the counted requests
STALL = dict(mode="batch", step_ms=2, per_seq_ms=0.25, jit_batch=12, jit_after=20, jit_ms=1000)
SEARCH = dict(start=30, requests_per_step=60, warmup=2, max_steps=2, refine_steps=0)   # 30 streams, then one more


async def search(tmp_path: Path, watch: bool, **cfg):
    log = tmp_path / "server.log"
    log.write_text("(APIServer pid=1) INFO 11-30 14:47:29 [api_server.py:581] Starting vLLM server\n")
    async with serve(build_app(MockConfig(log_path=str(log), **{**STALL, **cfg}))) as url:
        r = await find_capacity(url, "mock", W, TPOT, step_watch=JitWatch(log) if watch else None, **SEARCH)
    return r, log.read_text()


async def test_without_the_watch_the_compile_breaks_its_step_and_caps_the_capacity(tmp_path):
    r, log = await search(tmp_path, watch=False)
    assert log.count("JIT compilation during inference: fused_moe_kernel") == 1
    assert [s.load for s in r.steps] == [30] and not r.steps[0].slo_met   # 30 streams measured the stall
    assert r.capacity is None                   # "broke the SLO even at the lowest load"; the truth is 112
    assert not any(s.disturbances for s in r.steps) and "jit_compile" not in r.flags


async def test_the_disturbed_step_is_re_run_and_the_re_run_is_used(tmp_path):
    r, log = await search(tmp_path, watch=True)
    assert log.count("JIT compilation during inference: fused_moe_kernel") == 1
    [rerun] = [s for s in r.steps if s.disturbances]
    assert rerun.load == 30 and rerun.disturbances == ["the server JIT-compiled fused_moe_kernel during the step"]
    assert rerun.discarded is not None and rerun.discarded is not rerun.measurement
    # the discarded run saw the 1 s stall, the re-run (kernel cached) did not
    assert rerun.discarded.metrics.get("p99_tpot_ms", 1e9) > 30 or rerun.discarded.aborted_early
    assert "jit_compile" not in r.flags
    # the re-run meets the limit and decides the step, unless a busy machine starved the client (it flags
    # itself saturated): then its p99 may break 30 ms without a compile
    if not rerun.measurement.client.saturated:
        assert rerun.slo_met and rerun.measurement.metrics["p99_tpot_ms"] <= 30
        assert len(r.steps) == 2 and r.capacity is not None and r.capacity >= 30
    assert f"step at {rerun.load:g} re-run: the server JIT-compiled fused_moe_kernel" in r.note
    assert r.to_json()["steps"][r.steps.index(rerun)]["disturbances"] == rerun.disturbances


async def test_a_re_run_that_compiles_again_is_kept_and_flagged(tmp_path):
    r, log = await search(tmp_path, watch=True, jit_times=2)
    assert log.count("JIT compilation during inference: fused_moe_kernel") == 2
    [twice] = r.steps
    assert len(twice.disturbances) == 2 and not twice.slo_met   # the kept re-run measured the second stall
    assert r.capacity is None and "jit_compile" in r.flags
    assert "its re-run too, kept (jit_compile)" in r.note
