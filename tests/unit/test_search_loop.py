"""The search policy inside the real study loop (real Optuna, real SQLite), with an engine whose
launches fail at startup as told: learned limits, duplicates, the twin's warm start, the cache env."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from autotune import causes
from autotune.flags import flags_to_mapping
from autotune.space import SearchSpace
from autotune.spec import build_spec
from autotune.telemetry import get_source
from autotune.tuner import search_hooks
from autotune.node.scheduler import Scheduler
from autotune.tuner.command import host_pool
from autotune.tuner.driver import StudyDriver, StudyResult
from autotune.engine.base import Engine, EngineFailure, LaunchRequest, Server, StartupInfo

NO_SUCH_PID = 4_194_000   # never a live process: the loop's leftover cleanup has nothing to stop


class FakeServer(Server):
    def __init__(self, failure: EngineFailure, log_path: Path):
        self.pid, self.url, self.log_path, self._failure = NO_SUCH_PID, "http://127.0.0.1:9", log_path, failure

    def wait_ready(self) -> StartupInfo:
        raise self._failure

    def alive(self) -> bool:
        return False

    def failure(self) -> EngineFailure | None:
        return self._failure

    def stop(self, grace_s: float = 15.0) -> None:
        pass


class FailingEngine(Engine):
    """`fail(flags)` -> (cause, detail) for each launch; every launch is recorded in `launches`."""

    name = "fake"

    def __init__(self, fail: Callable[[Sequence[str]], tuple[str, str]]):
        self.fail = fail
        self.launches: list[LaunchRequest] = []

    def launch(self, request: LaunchRequest) -> Server:
        self.launches.append(request)
        cause, detail = self.fail(request.flags)
        return FakeServer(EngineFailure(cause, detail), request.log_path)

    def unknown_flags(self, flags: Sequence[str]) -> list[str]:
        return []

    def version(self) -> str | None:
        return "fake"

FREE_LINE = ("Free memory on device cuda:0 (70.0/139.8 GiB) on startup is less than desired GPU memory "
             "utilization (0.92, 128.62 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
             "other processes.")


class _Run:
    """`run` as the CLI does it: one driver behind a one-slot scheduler."""

    def __init__(self, driver: StudyDriver):
        self.driver = driver

    def run(self) -> StudyResult:
        scheduler = Scheduler(host_pool(self.driver.spec, 1), parallel=1)
        scheduler.add(self.driver)
        scheduler.run_until_done()
        return self.driver.result()


def _loop(tmp_path: Path, space: dict[str, Any], engine: FailingEngine, n_trials: int, **extra: Any) -> _Run:
    spec = build_spec({"name": "s", "model": str(tmp_path), "engine": {"kind": "vllm", "command": ["vllm"]},
                       "storage": f"sqlite:///{tmp_path}/s.db", "telemetry": {"source": "none"}, **extra}, "test")
    sp = SearchSpace.from_mapping(space, "test")
    return _Run(StudyDriver(spec, sp, engine, get_source("none"), n_trials, None, [], ["vllm"], live=False))


def _rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "s.db") as conn:
        return conn.execute("select number, role, state, cause, detail, params from autotune_trials "
                            "order by number").fetchall()


def _gmu(flags: Sequence[str]) -> float | None:
    v = flags_to_mapping(list(flags)).get("gpu_memory_utilization")
    return None if v is None else float(v)


def test_a_failure_that_states_its_limit_narrows_the_space(tmp_path: Path) -> None:
    def fail(flags: Sequence[str]) -> tuple[str, str]:
        g = _gmu(flags)
        if g is None or g > 70.0 / 139.8:
            return causes.STARTUP_OOM, FREE_LINE
        return causes.CRASH, "RuntimeError: something else (exit code 1)"

    engine = FailingEngine(fail)
    space = {"params": {"gpu_memory_utilization": {"type": "float", "low": 0.30, "high": 0.70, "step": 0.01,
                                                   "default": 0.92}}}
    # one candidate above the limit for certain (enqueued: asked right after the baseline taught the limit);
    # TPE's own draws, seeded per process, fell below it in about one run in nine
    result = _loop(tmp_path, space, engine, n_trials=4, enqueue=[{"gpu_memory_utilization": 0.65}]).run()
    launched = [_gmu(r.flags) for r in engine.launches]
    assert launched[0] is None                        # the baseline: vLLM's defaults, no flags
    limit = round(70.0 / 139.8 - 0.01, 4)
    assert all(g is not None and g <= limit for g in launched[1:]), launched
    assert len(engine.launches) == 4 == result.complete   # rejected candidates do not count
    rows = _rows(tmp_path)
    rejected = [r for r in rows if r[3] == causes.CONSTRAINT]
    assert any(json.loads(r[5]) == {"gpu_memory_utilization": 0.65} for r in rejected), rows
    assert all("learned from a failure" in r[4] and f"gpu_memory_utilization <= {limit:g}" in r[4] for r in rejected)
    with sqlite3.connect(tmp_path / "s.db") as conn:
        stored = conn.execute("select param, op, value, trial_number from autotune_limits").fetchall()
    assert stored == [("gpu_memory_utilization", "<=", limit, 0)]


def test_duplicates_are_skipped_and_not_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.tuner import policy

    # the study ends after this many proposals in a row settled without a launch (200 in the product: each
    # is an Optuna trial told and stored, about a minute of this machine for the rule alone)
    monkeypatch.setattr(policy, "MAX_FREE_IN_A_ROW", 20)
    engine = FailingEngine(lambda flags: (causes.CRASH, "exit code 1"))
    # three distinct configurations (the baseline and two choices) for a budget of four: the sampler must
    # propose duplicates, which are told without a launch, never counted, and end the study once the
    # space has nothing new (each process seeds its sampler differently, so no seed is relied on)
    space = {"params": {"max_num_seqs": {"type": "categorical", "choices": [16, 32], "default": 1024}}}
    result = _loop(tmp_path, space, engine, n_trials=4, sampler="random").run()
    keys = [tuple(r.flags) for r in engine.launches]
    assert len(keys) == len(set(keys)) == 3 == result.complete   # baseline + each of the 2 choices once
    rows = _rows(tmp_path)
    dups = [r for r in rows if r[2] == "duplicate"]
    assert dups and all(r[4].startswith("same flags as trial ") for r in dups)
    assert len(dups) >= 20                                      # the study stopped by the spent-space rule


def _stand_in_twin(monkeypatch: pytest.MonkeyPatch, predict: Callable[[dict[str, Any]], Any]) -> None:
    """The twin replaced by `predict`, which cannot cross processes: the warm start ranks in a thread."""
    monkeypatch.setattr(search_hooks, "twin_source", lambda loop, gpu, num: (predict, None))


WARM_SPACE = {"params": {"max_num_seqs": {"type": "int", "low": 16, "high": 1024, "default": 1024},
                         "enable_prefix_caching": {"type": "bool", "default": True}}}


def _by_seqs(params: dict[str, Any]) -> dict[str, float]:
    return {"capacity_tps": float(params["max_num_seqs"]), "p50_tpot_ms": 5.0}


def test_the_twin_warm_start_enqueues_its_picks_after_the_baseline(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    calls: list[dict[str, Any]] = []
    ranked = threading.Event()

    def predict(params: dict[str, Any]) -> dict[str, float]:
        if threading.current_thread().name == "warm-start-rank":     # the ranking, not a trial's own
            calls.append(dict(params))                               # prediction beside it
            if len(calls) == 50:
                ranked.set()
        return _by_seqs(params)

    order: list[str] = []

    def fail(flags: Sequence[str]) -> tuple[str, str]:
        if not order:                                   # the baseline's server "starts" until the ranking is done
            assert ranked.wait(60)
        order.append("launch")
        return causes.CRASH, "exit code 1"

    _stand_in_twin(monkeypatch, predict)
    _loop(tmp_path, WARM_SPACE, FailingEngine(fail), n_trials=4,
          warm_start={"from": "twin", "k": 2, "candidates": 50}).run()
    assert len(calls) == 50
    best = sorted(calls, key=lambda p: -p["max_num_seqs"])       # the twin's ranking of the candidates
    rows = _rows(tmp_path)
    assert [r[1] for r in rows[:3]] == ["baseline", "warm_start", "warm_start"]
    assert [json.loads(r[5]) for r in rows[1:3]] == best[:2]
    with sqlite3.connect(tmp_path / "s.db") as conn:
        preds = dict(conn.execute("select number, rank from autotune_predictions").fetchall())
    assert preds[1] == 1 and preds[2] == 2 and set(preds) >= {0, 1, 2, 3}   # every trial carries the twin's rank
    assert preds[0] is not None    # the baseline, predicted before the ranking existed, got its rank after


def test_a_ranking_still_running_when_the_baseline_ends_refines_the_later_picks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline ends (here: fails to start) before the twin has ranked anything: the picks of that
    moment (none) are taken at once, later trials do not wait; the full ranking's picks follow."""
    import threading

    holder: dict[str, Any] = {}
    launches: list[int] = []

    def predict(params: dict[str, Any]) -> dict[str, float]:
        # ranks only once the sampler's first trial has launched: the baseline has ended (the deadline
        # passed with nothing ranked) and the next trial was asked without waiting. (Waiting for the
        # deadline alone let a quick ranking enqueue its picks before that ask, seen on a busy machine.)
        if threading.current_thread().name == "warm-start-rank":
            started = threading.Event()
            for _ in range(12000):                             # a cap of two minutes, not a clock
                if len(launches) >= 2:
                    started.set()
                    break
                started.wait(0.01)
            assert started.is_set(), "the sampler's first trial never launched"
        return _by_seqs(params)

    def fail(flags: Sequence[str]) -> tuple[str, str]:
        launches.append(1)
        if len(launches) > 1:                                  # the sampler's trials end once ranked
            assert holder["run"].driver.warm.finished(60)
        return causes.CRASH, "exit code 1"

    _stand_in_twin(monkeypatch, predict)
    holder["run"] = _loop(tmp_path, WARM_SPACE, FailingEngine(fail), n_trials=5,
                          warm_start={"from": "twin", "k": 2, "candidates": 30})
    holder["run"].run()
    warm = holder["run"].driver.warm
    rows = _rows(tmp_path)
    assert rows[0][1] == "baseline" and rows[1][1] == "search"    # nothing ranked at the deadline: no pick
    refined = [json.loads(r[5]) for r in rows if r[1] == "warm_start"]
    best = sorted((p.params for p in warm.picks), key=lambda p: -p["max_num_seqs"])
    assert refined == best and len(refined) == 2               # the full ranking's picks, run later
    assert best[0]["max_num_seqs"] == max(c["max_num_seqs"] for c in warm.candidates)


def test_trials_share_compile_caches_under_the_study_folder(tmp_path: Path) -> None:
    engine = FailingEngine(lambda flags: (causes.CRASH, "exit code 1"))
    space = {"params": {"max_num_seqs": {"type": "categorical", "choices": [16, 32], "default": 1024}}}
    _loop(tmp_path, space, engine, n_trials=2).run()
    envs = [r.env for r in engine.launches]
    assert envs[0]["VLLM_CACHE_ROOT"] == envs[1]["VLLM_CACHE_ROOT"] == str((tmp_path / "s-cache" / "vllm").resolve())
    assert {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"} <= set(envs[0])
    assert Path(envs[0]["TRITON_CACHE_DIR"]).is_dir()


def test_show_lists_the_learned_limit_and_the_twin_beside_each_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import json

    from autotune.report.show import show_command

    _stand_in_twin(monkeypatch, lambda params: {"capacity_tps": 100.0 * params.get("gpu_memory_utilization", 0.92)})
    engine = FailingEngine(lambda flags: (causes.STARTUP_OOM, FREE_LINE))
    space = {"params": {"gpu_memory_utilization": {"type": "float", "low": 0.30, "high": 0.60, "step": 0.01,
                                                   "default": 0.92}}}
    _loop(tmp_path, space, engine, n_trials=2, warm_start={"from": "twin", "k": 1, "candidates": 20}).run()
    capsys.readouterr()
    show_command(argparse.Namespace(storage=f"sqlite:///{tmp_path}/s.db", study_name=None, json=True))
    doc = json.loads(capsys.readouterr().out)
    assert doc["learned_limits"][0]["param"] == "gpu_memory_utilization" and doc["learned_limits"][0]["trial"] == 0
    launched = [r for r in doc["trials"] if r["state"] != "duplicate" and r["cause"] != causes.CONSTRAINT]
    assert len(launched) == 2 and all(r["twin"] is not None and r["twin"]["simulated"] for r in launched)
    show_command(argparse.Namespace(storage=f"sqlite:///{tmp_path}/s.db", study_name=None, json=False))
    text = capsys.readouterr().out
    # the table's narrow columns fold their headers: "twin capacity_tps" may wrap inside its cell
    assert "learned limit" in text and "twin" in text and "SIMULATED, beside the measurement" in text


def test_a_baseline_written_as_text_is_recorded_as_the_value_it_launched(tmp_path: Path, capsys) -> None:
    """A quoted YAML number or choice ('0.25', 'false') in `baseline:` is the knob's value, recorded as
    launched; a value the space cannot hold is launched as given and said so, in one line."""
    engine = FailingEngine(lambda flags: (causes.CRASH, "exit code 1"))
    space = {"params": {"gpu_memory_utilization": {"type": "float", "low": 0.05, "high": 0.5, "step": 0.05},
                        "enable_prefix_caching": {"type": "bool", "default": True},
                        "max_num_seqs": {"type": "int", "low": 4, "high": 64, "default": 64}}}
    _loop(tmp_path, space, engine, n_trials=1,
          baseline={"gpu_memory_utilization": "0.25", "enable_prefix_caching": "false", "max_num_seqs": 100}).run()
    (number, role, _, _, _, params), = _rows(tmp_path)
    assert role == "baseline" and json.loads(params) == {"gpu_memory_utilization": 0.25,
                                                         "enable_prefix_caching": False, "max_num_seqs": 64}
    assert flags_to_mapping(list(engine.launches[0].flags))["max_num_seqs"] == "100"     # launched as given
    err = capsys.readouterr().err
    assert "baseline: max_num_seqs=100 outside the search space: launched as given" in err


def test_a_candidate_breaking_a_known_constraint_costs_no_trial(tmp_path: Path) -> None:
    # enqueued, so no draw decides it: the first candidate breaks "batched tokens >= max seqs" and is
    # rejected without a launch; the budget of two trials still launches the second one
    engine = FailingEngine(lambda flags: (causes.CRASH, "exit code 1"))
    space = {"params": {"max_num_seqs": {"type": "categorical", "choices": [16, 512], "default": 1024},
                        "max_num_batched_tokens": {"type": "categorical", "choices": [256, 2048], "default": 8192}}}
    result = _loop(tmp_path, space, engine, n_trials=2,
                   enqueue=[{"max_num_seqs": 512, "max_num_batched_tokens": 256},
                            {"max_num_seqs": 16, "max_num_batched_tokens": 2048}]).run()
    rows = _rows(tmp_path)
    assert [(r[1], r[3]) for r in rows] == [("baseline", causes.CRASH), ("enqueued", causes.CONSTRAINT),
                                           ("enqueued", causes.CRASH)], rows
    assert "max_num_batched_tokens (256) < max_num_seqs (512)" in rows[1][4]
    assert len(engine.launches) == 2 and result.complete == 2
