"""The measurement worker process (node/worker.py): spawned clean, pinned to its cores, named; a worker
killed outright is a `WorkerDied` with its signal; one whose parent is SIGKILLed dies with it (the
parent-death signal). Real processes; each waits for an event with a generous cap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.node.worker import PROCESS_NAME, Worker, WorkerDied
from autotune.tuner.measure import TARGET

REPO = Path(__file__).resolve().parents[2]


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def test_a_worker_is_pinned_named_and_answers_a_stop_before_any_request(wait_until) -> None:
    cores = sorted(os.sched_getaffinity(0))[:1]
    w = Worker(TARGET, cores=cores).start()
    try:
        wait_until(lambda: _name(w.pid) == PROCESS_NAME, 60, "the worker to name itself")
        assert sorted(psutil.Process(w.pid).cpu_affinity()) == cores
        w.request_stop("SIGTERM")
        msg = wait_until(lambda: w.poll(0.2), 60, "the worker's answer")
        assert msg == {"kind": "stopped", "reason": "SIGTERM"}
        pid = w.pid
    finally:
        w.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_killed_worker_is_a_worker_died_with_its_signal(wait_until) -> None:
    w = Worker(TARGET).start()
    try:
        wait_until(lambda: _name(w.pid) == PROCESS_NAME, 60, "the worker to start")
        os.kill(w.pid, signal.SIGKILL)
        with pytest.raises(WorkerDied) as died:
            end = time.monotonic() + 30
            while time.monotonic() < end:
                w.poll(0.2)
        assert "was killed by SIGKILL" in str(died.value) and died.value.pid is not None
    finally:
        w.close()


def test_a_worker_dies_with_its_parent(wait_until) -> None:
    """The daemon killed outright takes its workers along (PR_SET_PDEATHSIG, asked by the worker)."""
    code = ("import sys, time; from autotune.node.worker import Worker; from autotune.tuner.measure import TARGET; "
            "w = Worker(TARGET).start(); print(w.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        wait_until(lambda: _name(pid) == PROCESS_NAME, 60, "the worker to start")
        parent.kill()
        parent.wait(timeout=30)
        wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
                   "the worker to die with its parent")
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait(timeout=30)


def test_a_steps_progress_line_gives_the_figure_the_objective_takes() -> None:
    """The step at 267 streams of the H100 decode study's #3 (max-num-seqs 266): its fully-loaded window
    read 14,098 tok/s, the figure capacity_tps took, and the whole step 12,393 with its drain."""
    from autotune.tuner.measure import step_tps

    assert step_tps({"output_throughput": 12392.6, "steady_output_throughput": 14098.4}) == \
        "14098 tok/s (12393 over the whole step)"
    assert step_tps({"output_throughput": 14011.0, "steady_output_throughput": 14103.0}) == "14103 tok/s"
    assert step_tps({"output_throughput": 2094.0}) == "2094 tok/s"     # no window: the whole step's
