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
