"""The fault matrix (docs/RELIABILITY.md): every way a candidate can fail is a recorded trial with its
cause, the study goes on, the database stays consistent and no server process is left.

Driven through `autotune.cli.main(["run", ...])` in this process (the same path as the command), with
the `vllm` engine starting tests/fixtures/standin_vllm.py as a real subprocess on loopback: a stand-in
that prints vLLM's log lines and misbehaves on command, for the faults the vLLM CPU build cannot show
here in seconds (or at all: a runtime OOM must not push the shared box into its OOM killer). The real
vLLM CPU build shows its own causes in tests/e2e/test_engine_vllm.py and tests/e2e/test_fault_matrix_vllm.py.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from autotune import causes
from autotune.cli import main

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "standin_vllm.py"


def study(tmp_path: Path, model: Path, mode: str = "ok", *, env: dict[str, str] | None = None,
          extra: list[str] | None = None, **over: Any) -> Path:
    script = tmp_path / "standin_vllm.py"   # a copy under tmp_path: its processes are found by that path
    shutil.copy(STANDIN, script)
    spec: dict[str, Any] = {
        "name": "faults", "model": str(model),
        "engine": {"kind": "vllm", "command": ["{python}", str(script)],
                   "extra_flags": ["--max-model-len", "512", *(extra or [])],
                   "env": {"STANDIN_MODE": mode, "STANDIN_AFTER": "12", **(env or {})}, "startup_timeout_s": 120},
        "search_space": {"params": {"max_num_seqs": {"type": "int", "low": 2, "high": 16, "log": True},
                                    "max_num_batched_tokens": {"type": "int", "low": 256, "high": 4096},
                                    "enable_chunked_prefill": {"type": "bool", "default": True}}},
        "workload": {"kind": "random", "input_len": 16, "output_len": 8},
        "slo": "ttft:p99<=1s",
        "objectives": ["output_tps", "p50_tpot_ms"],
        "load": {"mode": "fixed", "concurrency": 2, "num_requests": 16, "warmup": 0, "stall_timeout_s": 2},
        "telemetry": {"source": "none"},
        "storage": f"sqlite:///{tmp_path}/faults.db",
        "confirm": {"enabled": False},      # the faults are the trials' own, not the confirmation's
    }
    for key, value in over.items():
        spec[key] = value
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def rows(tmp_path: Path, sql: str = "select number, state, cause, detail, log_tail, log_path "
                                     "from autotune_trials order by number") -> list[tuple]:
    with sqlite3.connect(tmp_path / "faults.db") as conn:
        return conn.execute(sql).fetchall()


def left_behind(tmp_path: Path) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(tmp_path / "standin_vllm.py") in (p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def run(spec: Path, n_trials: int = 1) -> int:
    return main(["run", "--study", str(spec), "--n-trials", str(n_trials), "--no-progress"])


# mode -> (cause, words of the detail). Each is one candidate; the study records it and ends normally.
FAULTS = {
    "exit-start": (causes.CRASH, "stand-in worker exited during start"),
    "startup-oom": (causes.STARTUP_OOM, "CUDA out of memory. Tried to allocate 2.00 GiB"),
    "kv-small": (causes.KV_TOO_SMALL, "To serve at least one request"),
    "bad-config": (causes.BAD_CONFIG, "max_num_batched_tokens (512) is smaller than max_model_len (2048)"),
    "hang": (causes.STARTUP_TIMEOUT, "not ready within 3 s"),
    "crash-load": (causes.CRASH, "stand-in engine core died under load"),
    "oom-load": (causes.RUNTIME_OOM, "CUDA out of memory. Tried to allocate 1.00 GiB"),
    "oomkill-load": (causes.RUNTIME_OOM, "SIGKILL"),
}


@pytest.mark.parametrize("mode", sorted(FAULTS))
def test_each_fault_is_a_trial_with_its_cause_and_nothing_is_left(mode: str, tmp_path: Path,
                                                                    demo_model_dir: Path) -> None:
    cause, words = FAULTS[mode]
    spec = study(tmp_path, demo_model_dir, mode)
    if mode == "hang":
        raw = yaml.safe_load(spec.read_text())
        raw["engine"]["startup_timeout_s"] = 3
        spec.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    assert run(spec) == 0
    took = time.monotonic() - started
    (number, state, got, detail, log_tail, log_path), = rows(tmp_path)
    assert (state, got) == ("failed", cause), detail
    assert words in detail and "\n" not in detail
    assert log_tail and Path(log_path).is_file()
    assert not left_behind(tmp_path)
    with sqlite3.connect(tmp_path / "faults.db") as conn:   # Optuna and our table agree: one finished trial
        assert conn.execute("select state from trials").fetchall() == [("COMPLETE",)]
    assert took < 180, f"{mode} took {took:.0f} s"      # a fault ends the trial: no timeout of minutes waited


@pytest.mark.parametrize("mode, cause", [("oom-load", causes.RUNTIME_OOM), ("crash-load", causes.CRASH)])
def test_a_server_whose_requests_fail_before_its_process_exits_is_a_failed_trial(
        mode: str, cause: str, tmp_path: Path, demo_model_dir: Path) -> None:
    """vLLM's engine core dies: the requests fail at once, the API server exits a moment later. The trial
    is the death, with its cause, not a measurement of the requests that came back (seen in CI: a runtime
    OOM recorded as `ok` because the client finished before the process was gone)."""
    spec = study(tmp_path, demo_model_dir, mode, env={"STANDIN_EXIT_DELAY_MS": "1500"})
    assert run(spec) == 0
    (number, state, got, detail, log_tail, log_path), = rows(tmp_path)
    assert (state, got) == ("failed", cause), detail
    assert not left_behind(tmp_path)


@pytest.mark.parametrize("after, warmup, words", [
    (12, 0, "server stopped answering mid-stream: "),       # 12 requests answered, then every stream stalls
    (0, 2, "server stopped answering: every warm-up request failed: stalled: no byte for 2 s"),
])
def test_a_server_that_stops_answering_mid_stream_ends_the_step_in_bounded_time(
        after: int, warmup: int, words: str, tmp_path: Path, demo_model_dir: Path) -> None:
    spec = study(tmp_path, demo_model_dir, "stall", env={"STANDIN_AFTER": str(after)})
    raw = yaml.safe_load(spec.read_text())
    raw["load"]["warmup"] = warmup
    spec.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    assert run(spec) == 0
    took = time.monotonic() - started
    (number, state, cause, detail, log_tail, log_path), = rows(tmp_path)
    # each stalled request failed after the 2 s stall timeout instead of the 600 s request timeout, and the
    # trial is a failure of the server, not a measurement of it (nor a usage error that stops the study)
    assert (state, cause) == ("failed", causes.CRASH), detail
    assert detail.startswith(words) and "no byte for 2 s" in detail
    assert took < 180, f"took {took:.0f} s"                # not the 600 s request timeout
    assert not left_behind(tmp_path)


def test_the_models_own_length_rejects_a_candidate_before_launch(tmp_path: Path, demo_model_dir: Path) -> None:
    """The issue's case: no --max-model-len among the fixed flags, chunked prefill off, a token budget
    below the model's length (2048 in the demo model's config.json): `constraint`, never launched."""
    spec = study(tmp_path, demo_model_dir, "ok",
                 enqueue=[{"enable_chunked_prefill": False, "max_num_batched_tokens": 1024, "max_num_seqs": 4},
                          {"enable_chunked_prefill": True, "max_num_batched_tokens": 1024, "max_num_seqs": 4}])
    raw = yaml.safe_load(spec.read_text())
    raw["engine"]["extra_flags"] = []
    spec.write_text(yaml.safe_dump(raw))
    assert run(spec, n_trials=2) == 0
    # the rejection costs no budget: the next enqueued candidate runs as the study's second trial
    baseline, candidate, third = rows(tmp_path)
    assert third[1] in ("ok", "infeasible")
    assert baseline[1] in ("ok", "infeasible")
    assert candidate[1:3] == ("failed", causes.CONSTRAINT)
    assert candidate[3] == ("max_num_batched_tokens (1024) < max_model_len (2048, the model's own from its "
                            "config.json) with chunked prefill off")
    assert candidate[5] is None                                   # no log: nothing was launched
    assert not (tmp_path / "faults-logs" / "trial-0001.log").exists()


def test_a_port_taken_before_the_server_binds_is_retried_not_a_failed_trial(tmp_path: Path, demo_model_dir: Path,
                                                                           taken_port_first: Any) -> None:
    """Another process binds the chosen port between find_free_port and the server's bind: the
    stand-in fails as vLLM does (`OSError: [Errno 98] Address already in use`), and the runner launches
    the same candidate again on a new port."""
    assert run(study(tmp_path, demo_model_dir, "ok")) == 0
    (number, state, cause, detail, log_tail, log_path), = rows(tmp_path)
    taken, handed = taken_port_first.port, taken_port_first.handed
    assert handed[0] == taken and len(handed) == 2
    assert state in ("ok", "infeasible") and cause in (None, causes.CLIENT_SATURATED), detail
    log = Path(log_path).read_text()
    assert "Address already in use" in log and f"port {taken}" in log and f"port {handed[1]}" in log
    assert not left_behind(tmp_path)


def test_a_log_that_cannot_be_written_fails_the_trial_cleanly_and_the_study_goes_on(tmp_path: Path,
                                                                                  demo_model_dir: Path) -> None:
    """Disk full while writing evidence: trial 1's log is /dev/full (writes fail with ENOSPC, reads
    return NULs forever). The trial fails with its cause before a launch, the next one runs."""
    spec = study(tmp_path, demo_model_dir, "ok", enqueue=[{"max_num_seqs": 4}, {"max_num_seqs": 8}])
    logs = tmp_path / "faults-logs"
    logs.mkdir()
    (logs / "trial-0001.log").symlink_to("/dev/full")
    assert run(spec, n_trials=3) == 0
    trials = rows(tmp_path)
    assert [t[1] for t in trials] != [] and len(trials) == 3
    number, state, cause, detail, log_tail, log_path = trials[1]
    assert (state, cause) == ("failed", causes.CRASH)
    assert detail == f"cannot write the trial log {logs / 'trial-0001.log'}: No space left on device; not launched"
    assert trials[0][1] in ("ok", "infeasible") and trials[2][1] in ("ok", "infeasible")
    with sqlite3.connect(tmp_path / "faults.db") as conn:
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
        assert [s for (s,) in conn.execute("select state from trials order by number")] == ["COMPLETE"] * 3
    assert not left_behind(tmp_path)


def test_a_database_that_cannot_grow_stops_the_run_in_one_line_and_the_next_run_resumes(
        tmp_path: Path, demo_model_dir: Path) -> None:
    """The disk under the database fills up mid-study (a file size limit on the `autotune run` process:
    SQLite's writes beyond it fail, as on a full disk). The run stops with one line and exit code 1, the
    trial it was recording stays unfinished in both Optuna and our table, the database is intact, the
    server is stopped; the same command without the limit re-runs that candidate and finishes. Which write
    meets the limit depends on the database's page layout: when it is the trial's request series, written
    after the evidence and Optuna's tell, the trial stands in both and the next run goes on from it."""
    import os
    import resource
    import signal
    import subprocess

    # a token budget never below --max-model-len 512: no drawn candidate is rejected before launch (a
    # rejection costs no budget, so one would add a row and the counts below would hang on the draw)
    spec = study(tmp_path, demo_model_dir, "ok", search_space={"params": {
        "max_num_seqs": {"type": "int", "low": 2, "high": 16, "log": True},
        "max_num_batched_tokens": {"type": "int", "low": 512, "high": 4096},
        "enable_chunked_prefill": {"type": "bool", "default": True}}})
    assert run(spec) == 0                                       # trial 0, and the database exists
    limit = (tmp_path / "faults.db").stat().st_size + 4096      # a page or so of room, not a trial's evidence

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)           # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(spec), "--n-trials", "3",
                           "--no-progress"], capture_output=True, text=True, timeout=240, preexec_fn=full_disk,
                          env={**os.environ, "PYTHONPATH": repo})
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert last.startswith("autotune: error: cannot write the study's storage or logs: ") and "resume" in last
    assert not left_behind(tmp_path)
    with sqlite3.connect(tmp_path / "faults.db") as conn:
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
        optuna_states = [r[0] for r in conn.execute("select state from trials order by number").fetchall()]
    assert optuna_states in (["COMPLETE", "RUNNING"], ["COMPLETE", "COMPLETE"])
    ours = [r[1] for r in rows(tmp_path)][1:]
    if optuna_states[1] == "COMPLETE":
        # the limit bit after the evidence and Optuna's tell (on the trial's request series): the trial
        # stands, recorded in both, and the same command goes on from it
        assert ours in (["ok"], ["infeasible"])
        assert run(spec, n_trials=3) == 0
        states = [r[1] for r in rows(tmp_path)]
        assert "running" not in states and len(states) == 3, states
        return
    # our row of the unfinished trial was written only if the database still had room at its start
    assert ours in ([], ["running"])
    assert run(spec, n_trials=3) == 0                           # space again: the same command goes on
    states = [r[1] for r in rows(tmp_path)]
    # the unfinished trial is recorded interrupted either way: marked, or written by the recovery when its
    # row never made it to disk
    assert "running" not in states and len(states) == 4 and states[1] == "interrupted", states
    with sqlite3.connect(tmp_path / "faults.db") as conn:       # Optuna: the unrecorded candidate ran again next
        def params(state_or_number: str) -> list[tuple]:
            return conn.execute("select p.param_name, p.param_value from trial_params p join trials t using(trial_id) "
                                f"where {state_or_number} order by p.param_name").fetchall()
        assert params("t.state = 'FAIL'") == params("t.number = 2")


@pytest.mark.parametrize("jit_at, flagged", [("4", False), ("4,12", True)])
def test_a_step_during_which_the_server_compiled_a_kernel_is_re_run(jit_at: str, flagged: bool, tmp_path: Path,
                                                                    demo_model_dir: Path) -> None:
    # the probe sends requests 1-8; the 4th waits 1.5 s (TTFT SLO 1 s) and the server logs vLLM's JIT
    # warning; the re-run sends 9-16, and with "4,12" its 12th compiles again
    spec = study(tmp_path, demo_model_dir, "jit", env={"STANDIN_JIT_AT": jit_at},
                 load={"mode": "capacity", "max_steps": 2, "requests_per_step": 8, "warmup": 0, "refine_steps": 0})
    assert run(spec) == 0
    (capacity, flags, log_path), = rows(tmp_path, "select capacity, measurement_flags, log_path from autotune_trials")
    capacity, flags = json.loads(capacity), json.loads(flags)
    probe = capacity["steps"][0]
    assert probe["load"] == 1 and len(probe["disturbances"]) == (2 if flagged else 1)
    assert probe["disturbances"][0] == "the server JIT-compiled fused_moe_kernel during the step"
    assert probe["discarded_output_tokens"] is not None
    assert Path(log_path).read_text().count("JIT compilation during inference: fused_moe_kernel") == len(jit_at.split(","))
    assert probe["slo_met"] is not flagged          # the clean re-run met the SLO; a compiling one broke it
    assert ("jit_compile" in flags) is flagged and ("re-run" in capacity["note"])
    assert not left_behind(tmp_path)
