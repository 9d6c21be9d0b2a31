"""Startup figures and failure causes from real vLLM logs (tests/fixtures/logs, read by content)."""

from pathlib import Path

import pytest

from autotune import causes
from autotune.engine.logparse import classify_failure, parse_startup

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text(errors="replace")


def test_gpu_024_ok_log_gives_every_startup_figure():
    assert parse_startup(log("gpu-vllm0.24-8b-ok.log")) == {
        "kv_cache_tokens": 933_616,
        "max_concurrency": 227.93,
        "init_engine_seconds": 41.21,
        "model_memory_gib": 13.49,
        "graph_capture_seconds": 4.0,
        "engine_version": "0.24.0",
    }


def test_cpu_032_eager_log_gives_cpu_kv_and_init():
    found = parse_startup(log("cpu-vllm0.32-ok-eager.log"))
    assert found == {"kv_cache_tokens": 4_029_440, "max_concurrency": 3935.0,
                     "init_engine_seconds": 10.15, "engine_version": "0.32.0"}


def test_cpu_032_log_named_startup_memory_is_really_a_compiled_start():
    # The fixture README calls it a startup failure; its content is a successful non-eager start.
    text = log("cpu-vllm0.32-startup-memory.log")
    found = parse_startup(text)
    assert found["kv_cache_tokens"] == 3_917_056
    assert found["init_engine_seconds"] == 39.69
    assert "less than desired" not in text


@pytest.mark.parametrize("name, exit_code, cause, quoted", [
    ("gpu-vllm0.24-bad-flag.log", 2, causes.BAD_FLAG, "unrecognized arguments: --max-num-seqz"),
    ("gpu-vllm0.24-max-model-len-invalid.log", 1, causes.BAD_CONFIG, "User-specified max_model_len (131072)"),
    ("cpu-vllm0.32-bad-config-batched-below-model-len.log", 1, causes.BAD_CONFIG,
     "max_num_batched_tokens (512) is smaller than max_model_len (2048)"),
    ("gpu-vllm0.24-startup-free-memory.log", 1, causes.STARTUP_OOM,
     "Free memory on device cuda:0 (78.77/139.8 GiB) on startup is less than desired GPU memory utilization"),
    ("gpu-vllm0.24-startup-kv-too-small.log", 1, causes.KV_TOO_SMALL,
     "To serve at least one request with the model's max seq len (8192)"),
    ("cpu-vllm0.32-gmu-0.99-node-memory.log", 1, causes.STARTUP_OOM,
     "Available memory on node 0 (6.82/8.21 GiB) on startup is less than desired CPU memory utilization"),
    ("cpu-vllm0.32-gmu-0.05-kv-negative.log", 1, causes.KV_TOO_SMALL,
     "less than requested memory for kv (-0.15/0.47 GiB)"),
])
def test_real_failure_logs_are_classified_with_vllms_own_words(name, exit_code, cause, quoted):
    got_cause, detail = classify_failure(log(name), exit_code)
    assert got_cause == cause
    assert quoted in detail
    assert "\n" not in detail and len(detail) <= 300
    assert "(EngineCore pid=" not in detail  # vLLM's line prefix is stripped


def test_failure_logs_carry_no_startup_figures_they_never_reached():
    assert "kv_cache_tokens" not in parse_startup(log("gpu-vllm0.24-startup-kv-too-small.log"))
    assert parse_startup(log("gpu-vllm0.24-bad-flag.log")) == {}


def test_root_cause_wins_over_the_api_servers_generic_error():
    # Both logs end with "RuntimeError: Engine core initialization failed"; the cause is above it.
    for name in ("gpu-vllm0.24-startup-free-memory.log", "gpu-vllm0.24-startup-kv-too-small.log"):
        assert "Engine core initialization failed" in log(name)
        assert classify_failure(log(name), 1)[0] != causes.CRASH


def test_ok_log_that_later_exits_is_a_crash_quoting_its_error():
    cause, detail = classify_failure(log("cpu-vllm0.32-ok-eager.log"), 1)
    assert cause == causes.CRASH
    assert "EngineDeadError" in detail and "exit code 1" in detail


def test_cuda_oom_before_ready_is_startup_oom_and_after_ready_runtime_oom():
    oom = ("(EngineCore pid=9) ERROR 11-29 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
           "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB")
    assert classify_failure("INFO loading\n" + oom, 1)[0] == causes.STARTUP_OOM
    ready = "INFO:     Application startup complete.\n"
    cause, detail = classify_failure(ready + oom, 1)
    assert cause == causes.RUNTIME_OOM
    assert detail.startswith("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")


def test_sigkill_after_ready_reads_as_runtime_oom_and_before_as_crash():
    ready = log("cpu-vllm0.32-ok-eager.log").split("INFO:     127.0.0.1")[0]
    assert classify_failure(ready, -9) == (causes.RUNTIME_OOM,
                                           "killed by SIGKILL (killed, often the kernel OOM killer) after the server was ready")
    cause, detail = classify_failure("INFO starting\n", -11)
    assert cause == causes.CRASH and "SIGSEGV" in detail


def test_other_wordings_across_versions():
    cases = {
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`": causes.KV_TOO_SMALL,
        "ValueError: To serve at least one request with the models's max seq len (4096), (2.0 GiB KV cache "
        "is needed": causes.KV_TOO_SMALL,
        "vllm serve: error: argument --max-num-seqs: invalid int value: 'lots'": causes.BAD_FLAG,
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "  Value error, max_num_batched_tokens (16) is smaller than max_num_seqs (64)": causes.BAD_CONFIG,
        # the report: an older release raising the scheduler check as a plain ValueError
        "ValueError: max_num_batched_tokens (3055) is smaller than max_model_len (4096). This effectively "
        "limits the maximum sequence length": causes.BAD_CONFIG,
        "ValueError: Free memory on device (12.1/79.2 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.3 GiB)": causes.STARTUP_OOM,
    }
    for text, cause in cases.items():
        assert classify_failure(text, 1)[0] == cause, text
    # "TypeError: argument ..." is a crash, not argparse rejecting a flag
    assert classify_failure("TypeError: argument of type 'NoneType' is not iterable", 1)[0] == causes.CRASH


def test_version_from_older_banner_and_engine_line():
    assert parse_startup("INFO api_server.py:1] vLLM API server version 0.6.3.post1")["engine_version"] == "0.6.3.post1"
    assert parse_startup("Initializing a V1 LLM engine (v0.11.0) with config")["engine_version"] == "0.11.0"


def test_a_value_error_while_vllm_builds_its_config_is_bad_config_not_crash():
    trace = ("Traceback (most recent call last):\n"
             '  File "vllm/engine/arg_utils.py", line 1, in create_engine_config\n'
             "    raise ValueError(...)\n"
             "(APIServer pid=3) ValueError: Tensor parallel size (3) must divide the number of attention heads (32).\n")
    cause, detail = classify_failure(trace, 1)
    assert (cause, detail) == (causes.BAD_CONFIG,
                               "ValueError: Tensor parallel size (3) must divide the number of attention heads (32).")
    # the same ValueError raised elsewhere (in the engine core, after config) stays a crash
    assert classify_failure(trace.replace("create_engine_config", "run_engine_core"), 1)[0] == causes.CRASH


def test_a_kv_request_the_node_cannot_give_is_startup_oom_and_a_negative_one_kv_too_small():
    # the same vLLM line with a positive request (edited from the real log above): the fraction asked
    # for more than the node had free, which failure learning must read as "too large", not "too small"
    text = log("cpu-vllm0.32-gmu-0.05-kv-negative.log").replace("kv (-0.15/0.47 GiB)", "kv (9.10/0.47 GiB)")
    assert classify_failure(text, 1)[0] == causes.STARTUP_OOM
    assert classify_failure(log("cpu-vllm0.32-gmu-0.05-kv-negative.log"), 1)[0] == causes.KV_TOO_SMALL
