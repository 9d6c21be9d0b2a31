"""A kernel JIT-compiled while the server served, found in its log per load step: the parser on real
vLLM 0.24 lines (two H200s, MoE TP2; tests/fixtures/logs/README.md) and the watch's windows by byte
offset, replaying that log as it grew during the capacity search."""

from __future__ import annotations

from pathlib import Path

from autotune.engine.logparse import jit_compiles
from autotune.engine.logwatch import JitWatch

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
MOE = (LOGS / "gpu-vllm0.24-moe-tp2-jit-under-load.log").read_text()
RESET = "Successfully reset prefix cache"


def test_the_compiles_under_load_are_named_and_nothing_else():
    assert jit_compiles(MOE) == ["_compute_slot_mapping_kernel", "fused_moe_kernel"]
    # the monitor's activation line says "JIT compilations during inference will be logged": not a compile
    activated = [line for line in MOE.splitlines() if "Kernel JIT monitor activated" in line]
    assert len(activated) == 2 and jit_compiles("\n".join(activated)) == []


def test_startup_compilation_is_not_a_compile_under_load():
    startup = (LOGS / "gpu-vllm0.24-8b-ok.log").read_text() + (LOGS / "cpu-vllm0.32-ok-eager.log").read_text()
    assert "compil" in startup.lower()           # torch.compile, graph capture: before serving, not a stall
    assert jit_compiles(startup) == []


def test_triton_autotuning_printed_under_load_counts():
    # Triton's own print (runtime/autotuner.py), which vLLM's monitor turns on, seen with a worker prefix
    text = ("(Worker_TP0 pid=7) Triton autotuning for function _w8a8_block_fp8_matmul,\n"
            "(Worker_TP0 pid=7) with key as (16, 4096),\n(Worker_TP0 pid=7) finished after 2.31s,\n")
    assert jit_compiles(text) == ["_w8a8_block_fp8_matmul"]


def _steps(text: str) -> list[str]:
    """The log cut where each capacity step began: after each prefix-cache reset the search asked for."""
    lines = text.splitlines(keepends=True)
    cuts = [i + 1 for i, line in enumerate(lines) if RESET in line]
    return ["".join(lines[a:b]) for a, b in zip([0, *cuts], [*cuts, len(lines)])]


def test_each_step_sees_only_the_compiles_logged_during_it(tmp_path):
    before, probe, step16 = _steps(MOE)
    log = tmp_path / "trial-0000.log"
    log.write_text(before)                       # the server started; the search has not begun
    watch = JitWatch(log)
    seen = []
    for chunk in (probe, step16, "(APIServer pid=3930) INFO:     127.0.0.1:50638 - \"GET /metrics HTTP/1.1\" 200 OK\n"):
        watch.begin()
        with open(log, "a") as f:                # the server writes while the step runs
            f.write(chunk)
        seen.append(watch.disturbed())
    assert seen == ["the server JIT-compiled _compute_slot_mapping_kernel during the step",
                    "the server JIT-compiled fused_moe_kernel during the step",
                    None]                        # a compile of an earlier step is not counted again


def test_a_watch_created_after_the_compile_does_not_see_it(tmp_path):
    log = tmp_path / "trial.log"
    log.write_text(MOE)
    watch = JitWatch(log)                        # the window starts at the log's size now
    assert watch.disturbed() is None
    with open(log, "a") as f:
        f.write(MOE.splitlines(keepends=True)[-1])   # a later line that is no compile
    assert watch.disturbed() is None


def test_a_missing_log_disturbs_nothing(tmp_path):
    watch = JitWatch(tmp_path / "never-written.log")
    watch.begin()
    assert watch.disturbed() is None


# -- the search reads the log only once the step's requests are done -----------------------------------
COMPILE_LINE = [line + "\n" for line in MOE.splitlines() if "fused_moe_kernel" in line][0]


def _run(ttft_ms: float, aborted: bool):
    from autotune.bench.results import Measurement, RequestRecord
    rec = RequestRecord(start_s=0.0, ttft_ms=ttft_ms, e2el_ms=ttft_ms + 100, itl_ms=[10.0] * 10, input_tokens=8,
                        output_tokens=11, ok=True)
    return Measurement(metrics={"completed": 20, "total_output_tokens": 220, "output_throughput": 100.0},
                       records=[rec] * 20, aborted_early=aborted, load={"num_requests": 20})


def test_a_cut_short_step_whose_compile_is_logged_while_it_drains_is_re_run(tmp_path, monkeypatch):
    """vLLM logs the compile when it ends: after a cut-short step's client has gone. The search lets the
    server drain (the prefix-cache reset waits for it) before it asks the watch."""
    import asyncio

    from autotune.bench import capacity
    from autotune.bench.workloads import parse_workload
    from autotune.slo import SLO

    log = tmp_path / "trial.log"
    log.write_text(MOE.split(COMPILE_LINE)[0])
    runs, resets = [], []

    async def run_load(*args, **kw):
        runs.append(kw["seed"])
        return _run(1500.0, aborted=True) if len(runs) == 1 else _run(80.0, aborted=False)

    async def reset(url, wait_s=60.0):
        resets.append(len(runs))
        if len(runs) == 1 and resets.count(1) == 1:   # the compile ends while the cut-short step drains
            with open(log, "a") as f:
                f.write(COMPILE_LINE)
        return True

    monkeypatch.setattr(capacity, "run_load", run_load)
    monkeypatch.setattr(capacity, "reset_prefix_cache", reset)
    r = asyncio.run(capacity.find_capacity("http://x", "m", parse_workload("random:input_len=8,output_len=11"),
                                           SLO.parse("ttft:p99<=1s"), max_steps=2, requests_per_step=20,
                                           step_watch=JitWatch(log), upper=1))
    probe = r.steps[0]
    assert len(runs) == 2 and runs[1] == runs[0] + 1            # re-run once, on its own prompts
    assert probe.disturbances == ["the server JIT-compiled fused_moe_kernel during the step"]
    assert probe.discarded is not None and probe.discarded.aborted_early and probe.slo_met
    assert r.capacity == 1 and r.flags == []


def test_the_result_names_the_steps_whose_client_fell_behind(monkeypatch):
    """`client_saturated` on the result says that some step's latencies are not trusted; the note says
    which, with the client's own reason, so a reader can tell a starved probe from a starved capacity step."""
    import asyncio

    from autotune.bench import capacity
    from autotune.bench.results import ClientHealth
    from autotune.bench.workloads import parse_workload
    from autotune.slo import SLO

    async def run_load(*args, **kw):
        m = _run(80.0, aborted=False)
        if kw["concurrency"] == 1:
            m.client = ClientHealth(saturated=True, loop_lag_p99_ms=37.0, note="event-loop lag p99 37.0 ms > 20 ms")
        return m

    async def reset(url, wait_s=60.0):
        return True

    monkeypatch.setattr(capacity, "run_load", run_load)
    monkeypatch.setattr(capacity, "reset_prefix_cache", reset)
    r = asyncio.run(capacity.find_capacity("http://x", "m", parse_workload("random:input_len=8,output_len=11"),
                                           SLO.parse("ttft:p99<=1s"), max_steps=2, requests_per_step=20, upper=4,
                                           refine_steps=0))
    assert [s.load for s in r.steps] == [1.0, 4.0] and r.flags == ["client_saturated"]
    assert "client saturated at load 1 (event-loop lag p99 37.0 ms > 20 ms): those steps' latencies" in r.note


def test_a_deployments_instance_logs_are_watched_too(tmp_path):
    """A PD split's router log says nothing of kernels; its instances' logs do (engine/deployment.py)."""
    router, decode = tmp_path / "trial-0001.log", tmp_path / "trial-0001.decode-0.log"
    router.write_text("INFO router: Starting router on http://127.0.0.1:8000\n")
    before, _, step16 = _steps(MOE)
    decode.write_text(before)
    watch = JitWatch(router, [decode, tmp_path / "trial-0001.prefill-0.log"])   # (one not written yet)
    watch.begin()
    with open(decode, "a") as f:
        f.write(step16)
    assert watch.disturbed() == "the server JIT-compiled fused_moe_kernel during the step"
