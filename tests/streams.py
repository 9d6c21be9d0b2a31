"""Run the whole suite as concurrent pytest streams: `python tests/streams.py [pytest args]`.

Why: most of the suite's wall time is one process waiting on another (a vLLM start that is mostly
single-threaded imports, a simulator at a time scale, a daemon's poll), which leaves a core idle; run
one after another, the tests took most of an hour on two cores. Each stream is its own pytest session,
so a session fixture (PostgreSQL, a shared vLLM server) starts only in the stream whose tests ask for
it, and once there. How the tests are split: the comment above `streams()`.

Exit code: 0 when every stream passed, else the first non-zero code (pytest's: 1 failures, 2
interrupted, 5 nothing collected). Every line a stream prints is relayed with its stream's name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Three streams; every test runs in exactly one. "vllm": the tests marked `e2e` or `vllm` (tests/conftest.py
# sets the markers from the fixtures a test asks for), which run real vLLM CPU-build servers; they keep
# one stream so that two servers never start at once (a start is three processes importing torch and
# vLLM one after another: two at once beside the other streams took over four minutes). The other tests
# split by file: "sim" takes the slow simulator and PostgreSQL files below, "rest" everything else; the
# list balances the streams by the timings in docs/TESTING.md.
REAL_VLLM = "e2e or vllm"
SIM_FILES = (
    "integration/test_daemon_postgres.py",
    "integration/test_after_budget_sim.py",
    "integration/test_plateau_confirm.py",
    "integration/test_scheduler_sim.py",
    "integration/test_worker_faults_sim.py",
)


def streams(extra: list[str]) -> dict[str, list[str]]:
    """Each stream's pytest arguments (files missing from this checkout are left out of the list)."""
    sim = [str(TESTS / f) for f in SIM_FILES if (TESTS / f).exists()]
    base = ["-q", "-p", "no:cacheprovider", "--durations=15", *extra]
    return {
        "vllm": [*base, "-m", REAL_VLLM, str(TESTS)],
        "sim": [*base, "-m", f"not ({REAL_VLLM})", *sim],
        "rest": [*base, "-m", f"not ({REAL_VLLM})", *[f"--ignore={f}" for f in sim], str(TESTS)],
    }


def _relay(name: str, proc: subprocess.Popen, lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    started = time.monotonic()
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen] = {}
    relays = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        for name, args in streams(argv).items():
            procs[name] = subprocess.Popen([sys.executable, "-m", "pytest", *args], stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
            relays.append(threading.Thread(target=_relay, args=(name, procs[name], lock), daemon=True))
            relays[-1].start()
        codes, cpu = {}, {}
        by_pid = {proc.pid: name for name, proc in procs.items()}
        while len(codes) < len(procs):
            # whichever stream ends next (this process has no other children), with its CPU seconds:
            # its own and those of every process it reaped (servers, runs)
            pid, status, usage = os.wait4(-1, 0)
            if pid not in by_pid:
                continue
            name = by_pid[pid]
            procs[name].returncode = os.waitstatus_to_exitcode(status)
            codes[name], cpu[name] = procs[name].returncode, usage.ru_utime + usage.ru_stime
            with lock:
                print(f"[{name}] ended: exit {codes[name]}, {time.monotonic() - started:.0f} s after the start, "
                      f"{cpu[name]:.0f} CPU s", flush=True)
    except KeyboardInterrupt:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)      # pytest ends its session and its fixtures' servers
        for proc in procs.values():
            proc.wait()
        return 2
    for relay in relays:
        relay.join(timeout=10)
    took = time.monotonic() - started
    print(f"streams: {', '.join(f'{n} exit {codes[n]}' for n in procs)}; {took:.0f} s in all, "
          f"{sum(cpu.values()):.0f} CPU s")
    return next((c for c in codes.values() if c not in (0, 5)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
