"""The search policy's pure parts on real vLLM lines and hand-computed numbers: limits read from
failures, the early-stopping bound, duplicates by rendered flags, startup phases from real logs."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from autotune import causes
from autotune.engine.logparse import classify_failure
from autotune.engine.phases import startup_phases
from autotune.space import SearchSpace
from autotune.store.models import StudyRecord, TrialRecord
from autotune.store.queries import best_trial, pareto_front
from autotune.tuner.dedupe import Seen, flags_key
from autotune.tuner.earlystop import EarlyStop, StepView, capacity_bound, dominated, mark_stopped
from autotune.tuner.narrowing import GPUS, LearnedLimits, Limit, limit_from_failure
from autotune.tuner.policy import DUPLICATE, SearchPolicy
from autotune.tuner.trial import TrialOutcome

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
QUALITY_LOGS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "quality" / "logs"


def _classified(name: str) -> tuple[str, str]:
    return classify_failure((LOGS / name).read_text(), 1)


def test_free_memory_line_bounds_the_memory_fraction() -> None:
    cause, detail = _classified("gpu-vllm0.24-startup-free-memory.log")    # 78.77 of 139.8 GiB free
    lim = limit_from_failure(cause, detail, {"gpu_memory_utilization": 0.9}, trial=4)
    assert cause == causes.STARTUP_OOM and lim is not None
    assert (lim.param, lim.op, lim.trial) == ("gpu_memory_utilization", "<=", 4)
    assert lim.value == pytest.approx(78.77 / 139.8 - 0.01, abs=1e-4)
    limits = LearnedLimits([lim])
    assert limits.violation({"gpu_memory_utilization": 0.56}) is lim
    assert limits.violation({"gpu_memory_utilization": 0.55}) is None


def test_cpu_node_memory_line_and_kv_too_small_line() -> None:
    cause, detail = _classified("cpu-vllm0.32-gmu-0.99-node-memory.log")   # 6.82 of 8.21 GiB available
    lim = limit_from_failure(cause, detail, {"gpu_memory_utilization": 0.99})
    assert lim is not None and lim.value == pytest.approx(6.82 / 8.21 - 0.01, abs=1e-4)
    cause, detail = _classified("gpu-vllm0.24-startup-kv-too-small.log")   # 1.0 GiB needed, 0.09 there, at 0.105
    assert cause == causes.KV_TOO_SMALL
    lim = limit_from_failure(cause, detail, {}, effective={"gpu_memory_utilization": 0.105}, device_gib=139.8)
    assert lim is not None and lim.op == ">="
    assert lim.value == pytest.approx(0.105 + max((1.0 - 0.09) / 139.8, 0.01), abs=1e-4)   # at least a step


def test_batched_tokens_and_gpu_count_lines() -> None:
    line = ("1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens (2048) is smaller than "
            "max_model_len (4096). This effectively limits the maximum sequence length")
    lim = limit_from_failure(causes.BAD_FLAG, line, {"max_num_batched_tokens": 2048, "enable_chunked_prefill": False})
    assert lim is not None and (lim.param, lim.op, lim.value) == ("max_num_batched_tokens", ">=", 4096)
    limits = LearnedLimits([lim])
    assert limits.violation({"max_num_batched_tokens": 3000, "enable_chunked_prefill": False}) is lim
    assert limits.violation({"max_num_batched_tokens": 3000, "enable_chunked_prefill": True}) is None
    lim = limit_from_failure(causes.CRASH, "ValueError: World size (8) is larger than the number of available GPUs (4)",
                             {"parallel_layout": "tp8"})
    assert lim is not None and (lim.param, lim.value) == (GPUS, 4)
    layouts = {"tp8": {"tensor_parallel_size": 8}, "tp2-dp2": {"tensor_parallel_size": 2, "data_parallel_size": 2}}
    limits = LearnedLimits([lim])
    assert limits.violation({"parallel_layout": "tp8"}, layouts) is lim
    assert limits.violation({"parallel_layout": "tp2-dp2"}, layouts) is None
    assert limit_from_failure(causes.CRASH, "RuntimeError: CUDA error: an illegal memory access", {}) is None


def test_a_looser_limit_teaches_nothing() -> None:
    limits = LearnedLimits()
    assert limits.add(Limit("gpu_memory_utilization", "<=", 0.5, "a"))
    assert not limits.add(Limit("gpu_memory_utilization", "<=", 0.7, "b"))
    assert limits.add(Limit("gpu_memory_utilization", "<=", 0.4, "c"))
    assert [x.value for x in limits.limits] == [0.4]
    assert LearnedLimits.from_json(limits.to_json()).limits == limits.limits


def _steps() -> list[StepView]:
    # The H200 baseline's search (benchmarks/gpu/RESULTS.md): 1 ok 201 tok/s, 16 ok 1,889, 40 broken (aborted).
    return [StepView(1, True, 201.0, 4.76, 40.0), StepView(16, True, 1889.0, 5.92, 412.0),
            StepView(40, False, 0.0, None, None, aborted=True)]


def test_capacity_bound_from_the_steps_measured_so_far() -> None:
    b = capacity_bound(_steps(), ["capacity_tps", "p50_tpot_ms"])
    assert b is not None
    # capacity < 40: at most 39 streams at 16's per-stream speed; the aborted step's throughput is no bound
    assert b["capacity_tps"] == pytest.approx(39 * 1889.0 / 16 * 1.05)
    assert b["p50_tpot_ms"] == pytest.approx(5.92 * 0.95)
    full = [*_steps()[:2], StepView(40, False, 2731.0, 8.16, 1026.0)]      # a step that ran to the end
    assert capacity_bound(full, ["capacity_tps"])["capacity_tps"] == pytest.approx(2731.0 * 1.05)
    assert capacity_bound(_steps()[:2], ["capacity_tps"]) is None          # not bracketed yet
    assert capacity_bound(_steps(), ["capacity_tps", "tokens_per_joule"]) is None   # no bound for energy


def test_early_stop_only_when_the_front_dominates_the_bound() -> None:
    b = capacity_bound(_steps(), ["capacity_tps", "p50_tpot_ms"])
    assert b is not None
    assert dominated([b["capacity_tps"], b["p50_tpot_ms"]], [[b["capacity_tps"] + 1, b["p50_tpot_ms"]]], [True, False])
    assert not dominated([b["capacity_tps"], b["p50_tpot_ms"]], [[b["capacity_tps"] + 1, b["p50_tpot_ms"] + 1]],
                         [True, False])
    stop = EarlyStop(["capacity_tps", "p50_tpot_ms"], ["maximize", "minimize"], [[5000.0, 5.0]])
    assert not stop.should_stop(_steps()[:2]) and not stop.stopped
    assert stop.should_stop(_steps()) and stop.bound == b
    assert not EarlyStop(["capacity_tps", "p50_tpot_ms"], ["maximize", "minimize"], [[2000.0, 4.0]]).should_stop(_steps())


def test_an_early_stopped_trial_is_never_exported() -> None:
    outcome = TrialOutcome("ok", observed={"capacity_tps": 1500.0, "p50_tpot_ms": 6.0}, capacity={"capacity": 16})
    mark_stopped(outcome, {"capacity_tps": 7000.0, "p50_tpot_ms": 5.6})
    assert (outcome.state, outcome.cause) == ("stopped", causes.EARLY_STOPPED)
    assert outcome.capacity == {"capacity": 16, "bound": {"capacity_tps": 7000.0, "p50_tpot_ms": 5.6},
                                "early_stopped": True}
    study = StudyRecord(name="s", objectives=[["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]])
    stopped = TrialRecord(number=1, state=outcome.state, cause=outcome.cause, objectives={}, constraints={},
                          capacity=outcome.capacity)
    measured = TrialRecord(number=0, state="ok", objectives={"capacity_tps": 2500.0, "p50_tpot_ms": 8.5},
                           constraints={"failure": 0.0}, metrics={})
    assert best_trial(study, [stopped, measured]) is measured
    assert pareto_front(study, [stopped, measured]) == [measured]


def test_duplicates_by_rendered_flags_and_the_random_fallback() -> None:
    assert flags_key(["--max-num-seqs", "64", "--no-enable-prefix-caching"]) == \
        flags_key(["--no-enable-prefix-caching", "--max-num-seqs", "64"])
    seen = Seen()
    seen.add(["--max-num-seqs", "64"], 3)
    assert seen.earlier(["--max-num-seqs", "64"]) == 3 and seen.earlier(["--max-num-seqs", "65"]) is None
    space = SearchSpace.from_mapping({"params": {"max_num_seqs": {"type": "int", "low": 16, "high": 64},
                                                 "gpu_memory_utilization": {"type": "float", "low": 0.8,
                                                                            "high": 0.95, "step": 0.05}}}, "t")
    policy = SearchPolicy(space, [], 1, seed=1)
    params = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
    policy.ran(space.render(params), 3)
    found = policy.screen(params, space.render(params), "search")
    assert found is not None and (found.kind, found.earlier) == (DUPLICATE, 3)
    assert policy.screen(params, space.render(params), "confirm") is None    # confirmation repeats run
    assert [policy.proposed(found) for _ in range(3)] == [False, False, True]  # a stretch -> a random draw
    policy.limits.add(Limit("gpu_memory_utilization", "<=", 0.85, "free memory"))
    for _ in range(20):
        cand = policy.fallback()
        assert cand is not None and cand["gpu_memory_utilization"] <= 0.85 and 16 <= cand["max_num_seqs"] <= 64


def test_startup_phases_from_a_real_h200_log() -> None:
    p = startup_phases((LOGS / "gpu-vllm0.24-8b-ok.log").read_text(), total_s=83.0)
    assert p is not None
    # stated by vLLM: model loading 3.85 s, torch.compile 18.40 s, graph capture 4 s; from stamps: weights
    # started 15:48:31, KV size at 15:48:56 (3 s after compile ended at 15:48:53), server up 15:49:16
    assert (p["weights"], p["compile"], p["cuda_graphs"], p["kv_profiling"]) == (3.85, 18.4, 4.0, 3.0)
    assert p["process_imports"] == 83.0 - 45.0
    assert p["other"] == pytest.approx(83.0 - 38.0 - 3.85 - 18.4 - 3.0 - 4.0, abs=0.01)
    assert startup_phases((LOGS / "gpu-vllm0.24-bad-flag.log").read_text()) is None


@pytest.mark.parametrize("name,compile_s", [("trial-0000.log.gz", 27.30), ("trial-0006.log.gz", 58.61)])
def test_startup_phases_of_the_h200_quality_runs(name: str, compile_s: float) -> None:
    p = startup_phases(gzip.open(QUALITY_LOGS / name, "rt").read())
    assert p is not None and p["compile"] == pytest.approx(compile_s, abs=0.01)
    assert p["weights"] > 1 and p["process_imports"] > 15 and p["cuda_graphs"] > 0


def test_startup_phases_of_the_cpu_build() -> None:
    eager = startup_phases((LOGS / "cpu-vllm0.32-ok-eager.log").read_text())
    compiled = startup_phases((LOGS / "cpu-vllm0.32-startup-memory.log").read_text())
    assert eager is not None and compiled is not None
    assert eager["compile"] == 0 and eager["cuda_graphs"] == 0
    assert compiled["compile"] == 32.0       # "Warming up model for the compilation" 15:23:10 -> AOT saved 15:23:42


def test_startup_phases_of_a_two_gpu_log_read_the_first_worker() -> None:
    # round 2, TP2 on two H200s: both workers log; the first (TP0) line of each kind is the one read
    path = Path(__file__).resolve().parents[2] / "benchmarks/gpu/round2/device/logs/dense-trial-0001.log.gz"
    p = startup_phases(gzip.open(path, "rt").read())
    assert p is not None and (p["weights"], p["compile"], p["cuda_graphs"]) == (3.57, 25.37, 5.0)
