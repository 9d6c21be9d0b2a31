"""The new knobs through `autotune run` against the stand-in engine (tests/fixtures/standin_vllm.py, a real
process on loopback that prints vLLM's log lines; its --help lists only a few flags, as an older vLLM):

- the default space's knobs the engine's --help lacks are dropped with a one-line notice and never sent;
- an env knob reaches the server's environment, the DB and `show`;
- speculative decoding runs only when the study opts in, and then its acceptance rate (from /metrics)
  and the random-weight label are shown per trial.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "standin_vllm.py"
NEW_FLAGS = ("--async-scheduling", "--no-async-scheduling", "--stream-interval", "--max-cudagraph-capture-size",
             "--long-prefill-token-threshold", "--performance-mode", "--optimization-level", "--attention-backend",
             "--kv-cache-memory-bytes")


def _spec(tmp_path: Path, model: Path, **over: Any) -> Path:
    script = tmp_path / "standin_vllm.py"
    shutil.copy(STANDIN, script)
    spec: dict[str, Any] = {
        "name": "knobs", "model": str(model),
        "engine": {"kind": "vllm", "command": ["{python}", str(script)], "extra_flags": ["--max-model-len", "512"],
                   "startup_timeout_s": 20},
        "search_space": "default",
        "workload": {"kind": "random", "input_len": 16, "output_len": 8},
        "slo": "ttft:p99<=2s", "objectives": ["output_tps", "p50_tpot_ms"],
        "load": {"mode": "fixed", "concurrency": 2, "num_requests": 12, "warmup": 0},
        "telemetry": {"source": "none"}, "storage": f"sqlite:///{tmp_path}/knobs.db",
        "confirm": {"enabled": False}, "sampler": "random", "warm_start": False,
    }
    spec.update(over)
    path = tmp_path / "knobs.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _trials(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "knobs.db") as conn:
        return conn.execute("select number, state, params, env, log_path from autotune_trials order by number").fetchall()


def _args_sent(log_path: str) -> str:
    return next(line for line in Path(log_path).read_text().splitlines() if "non-default args" in line)


def test_knobs_the_engine_lacks_are_dropped_with_a_notice_and_never_sent(tmp_path: Path, demo_model_dir: Path,
                                                                         capsys) -> None:
    spec = _spec(tmp_path, demo_model_dir)
    assert main(["run", "--study", str(spec), "--n-trials", "4", "--no-progress"]) == 0
    out = capsys.readouterr().err      # the study's progress lines
    for knob, flag in (("stream_interval", "--stream-interval"), ("optimization_level", "--optimization-level"),
                       ("kv_cache_memory_bytes", "--kv-cache-memory-bytes")):
        line = next(ln for ln in out.splitlines() if f"knob {knob} dropped" in ln)
        assert f"the engine lacks {flag} (not in its --help): knob {knob} dropped, never sent" in line
    trials = _trials(tmp_path)
    launched = [t for t in trials if t[4]]
    assert len(launched) >= 3
    for number, state, params, env, log_path in launched:
        sent = _args_sent(log_path)
        assert not any(f"'{flag}'" in sent for flag in NEW_FLAGS), sent
        assert "--speculative-config" not in sent       # not opted in: never launched
        assert not set(json.loads(params)) & {"stream_interval", "speculative_config", "attention_backend"}
    # the memory fraction is still searched (it was conditional on the KV bytes the engine lacks)
    assert any("gpu_memory_utilization" in json.loads(t[2]) for t in launched if t[0] > 0)
    # a candidate that names a dropped or opt-in knob is refused before anything starts
    bad = _spec(tmp_path, demo_model_dir, enqueue=[{"speculative_config": "ngram-3"}], name="knobs2")
    assert main(["run", "--study", str(bad), "--n-trials", "1", "--no-progress"]) == 2
    assert "enqueue[0]: 'speculative_config' is not a parameter of the search space" in capsys.readouterr().err
    # ... and so is one whose value its own other values switch off (it would never be sent)
    # (a space of its own: this stand-in lacks the long-prefill threshold, the default space's case)
    before = len(_trials(tmp_path))
    off = _spec(tmp_path, demo_model_dir, name="knobs3",
                search_space={"params": {"enable_chunked_prefill": {"type": "bool", "default": True},
                                         "max_num_seqs": {"type": "int", "low": 2, "high": 16,
                                                          "when": {"enable_chunked_prefill": [True]}}}},
                enqueue=[{"enable_chunked_prefill": False, "max_num_seqs": 4}])
    assert main(["run", "--study", str(off), "--n-trials", "1", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "autotune: error: enqueue[0]: max_num_seqs applies only when enable_chunked_prefill is one of [True]")
    assert len(_trials(tmp_path)) == before          # nothing written, nothing launched


def test_an_env_knob_and_opted_in_speculative_decoding_reach_the_server_the_db_and_show(
        tmp_path: Path, demo_model_dir: Path, capsys) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("extends: default\n"
                     "params:\n"
                     "  test_knob: {type: categorical, env: VLLM_TEST_KNOB, choices: [none, 3, 7], default: none}\n")
    spec = _spec(tmp_path, demo_model_dir, search_space=str(space), speculative={"enabled": True},
                 enqueue=[{"speculative_config": "ngram-5", "test_knob": 7, "max_num_seqs": 16}])
    assert main(["run", "--study", str(spec), "--n-trials", "2", "--no-progress"]) == 0
    capsys.readouterr()
    baseline, pick = _trials(tmp_path)[:2]
    assert json.loads(pick[3]) == {"VLLM_TEST_KNOB": "7"} and json.loads(baseline[3] or "null") is None
    log = Path(pick[4]).read_text()
    assert "environment VLLM_TEST_KNOB=7" in log and "environment VLLM_TEST_KNOB" not in Path(baseline[4]).read_text()
    assert '"method":"ngram"' in _args_sent(pick[4]) and "--speculative-config" not in _args_sent(baseline[4])
    assert main(["show", "--storage", f"sqlite:///{tmp_path}/knobs.db", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    shown = rows["trials"][1]
    assert shown["env"] == {"VLLM_TEST_KNOB": "7"}
    # the stand-in accepts half of its draft tokens (STANDIN docstring)
    assert shown["spec_acceptance_pct"] == 50.0 and "speculative decoding: 50.0 %" in " ".join(shown["notes"])
    assert rows["speculative_label"].startswith("SPECULATIVE DECODING measured on random weights and synthetic")
