"""Run the whole suite as a pool of concurrent pytest sessions: `python tests/streams.py [--fast] [pytest args]`.

Why: most of the suite's wall time is one process waiting on another (a vLLM start that is mostly
single-threaded imports, a simulator at a time scale, a daemon's poll), which leaves a core idle; run
one after another, the tests took most of an hour on two cores. Three fixed streams (session 11) left
the machine half idle for the last third of the run while the real-vLLM stream finished alone. So the
suite is cut into jobs (a pytest session each: an e2e file, a slow simulator file, the tests that share
a session fixture, the quick rest) and a pool runs them longest first, three at a time, at most two of
them starting real vLLM servers (three vLLM starts at once beside other work passed their bounds); the
tests that time a mock server in the client's own loop run last, two jobs at most (QUIET).

Every test runs in exactly one job: the shared-server tests (`-m vllm`) and the PostgreSQL tests
(`-m postgres`) are selected by marker over the whole tree, so that their session fixture starts once;
every other job takes whole files and leaves those markers out. Exit code: 0 when every job passed (or
collected nothing), else the first failing job's code (pytest's: 1 failures, 2 interrupted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SLOTS = 3            # jobs at once (two cores: a third job fills the gaps of the other two)
VLLM_SLOTS = 2       # of which start real vLLM servers
OTHERS = "not (e2e or vllm or postgres)"
FAST = "not (e2e or vllm or postgres or browser or study)"     # `--fast`: the developer's loop (make test-fast)

# Seconds each heavy job took beside two others (docs/TESTING.md); the pool starts the longest first,
# so that no long job starts last. A file not named here is assumed short and joins "rest".
E2E = {"test_tuning_loop": 700, "test_vlm_study": 330, "test_engine_vllm": 150,
       "test_trace_study": 210, "test_fault_matrix_vllm": 185, "test_speculative_vllm": 200}
HEAVY = {"integration/test_after_budget_sim.py": 310, "integration/test_scheduler_sim.py": 300,
         "integration/test_study_loop_sim.py": 180, "integration/test_report_sim.py": 170,
         "integration/test_daemon_sim.py": 150, "integration/test_confirm_sim.py": 115,
         "integration/test_fault_matrix.py": 100, "integration/test_worker_faults_sim.py": 75,
         "integration/test_plateau_confirm.py": 65, "integration/test_ablate_sim.py": 60}
# Tests whose figures come from a mock server in the client's own event loop, asserted precisely unless
# the client flags itself starved (docs/TESTING.md): a loop a few ms late without the flag moved one past
# its bound with three jobs on two cores. They run last, as two "quiet" jobs with nothing else beside
# them but the last job still running (at most two jobs, one per core).
QUIET = (("integration/test_bench_mock.py", "integration/test_steady_steps_mock.py",
          "integration/test_bench_images_mock.py", "integration/test_jit_rerun_mock.py"),
         ("integration/test_capacity_hint.py", "integration/test_early_stop_mock.py",
          "integration/test_trace_replay_mock.py", "integration/test_step_bounds_mock.py"))


@dataclass
class Job:
    name: str
    args: list[str]
    vllm: bool                 # starts real vLLM servers
    estimate: float            # seconds, for the order only
    quiet: bool = False        # runs after every other job has started, at most one other job beside it
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ended: float = 0.0
    code: int | None = None
    cpu: float = 0.0
    failures: list[str] = field(default_factory=list)   # pytest's short summary lines (FAILED/ERROR ...)
    skips: list[str] = field(default_factory=list)      # and its SKIPPED lines, with the reason
    relay: threading.Thread | None = field(default=None, repr=False)


def jobs(extra: list[str]) -> list[Job]:
    """The suite as jobs (files missing from this checkout are left out)."""
    base = ["-q", "-rfEs", "-p", "no:cacheprovider", "--durations=5", *extra]
    out = [Job("vllm-shared", [*base, "-m", "vllm", str(TESTS)], True, 200),
           Job("postgres", [*base, "-m", "postgres and not vllm", str(TESTS)], False, 400)]
    for path in sorted((TESTS / "e2e").glob("test_*.py")):
        out.append(Job(f"e2e/{path.stem}", [*base, "-m", "not (vllm or postgres)", str(path)], True,
                       E2E.get(path.stem, 200)))
    heavy = [TESTS / f for f in HEAVY if (TESTS / f).exists()]
    for path in heavy:
        rel = str(path.relative_to(TESTS))
        out.append(Job(rel.split("/", 1)[1].removesuffix(".py"), [*base, "-m", OTHERS, str(path)], False, HEAVY[rel]))
    quiet = [[TESTS / f for f in group if (TESTS / f).exists()] for group in QUIET]
    for i, group in enumerate(quiet, 1):
        out.append(Job(f"mock-{i}", [*base, "-m", OTHERS, *map(str, group)], False, 0, quiet=True))
    skip = [*heavy, *(p for group in quiet for p in group)]
    out.append(Job("rest", [*base, "-m", OTHERS, *[f"--ignore={p}" for p in skip],
                            str(TESTS / "unit"), str(TESTS / "integration")], False, 250))
    return sorted(out, key=lambda j: -j.estimate)


def fast_jobs(extra: list[str]) -> list[Job]:
    """`make test-fast`: what needs no vLLM, PostgreSQL, browser or whole study, as three jobs (the unit
    tests, and the integration files taken in turn), since most of its wall time is mock servers waiting."""
    base = ["-q", "-rfEs", "-p", "no:cacheprovider", "--durations=5", "-m", FAST, *extra]
    files = sorted(str(p) for p in (TESTS / "integration").glob("test_*.py"))
    return [Job("unit", [*base, str(TESTS / "unit")], False, 3),
            Job("integration-1", [*base, *files[0::2]], False, 2),
            Job("integration-2", [*base, *files[1::2]], False, 1)]


def _relay(job: Job, lock: threading.Lock) -> None:
    assert job.proc is not None and job.proc.stdout is not None
    for line in job.proc.stdout:
        if line.startswith(("FAILED ", "ERROR ")):
            job.failures.append(line.rstrip())
        elif line.startswith("SKIPPED "):
            job.skips.append(line.rstrip())
        with lock:
            sys.stdout.write(f"[{job.name}] {line}")
            sys.stdout.flush()


def _start(job: Job, lock: threading.Lock, t0: float) -> None:
    # bytecode writing on (an empty PYTHONDONTWRITEBYTECODE is off): where the environment turns it off
    # (container images do), each autotune process the suite starts (CLIs, daemons, trial workers)
    # compiles the package from source again, 0.8 s of a 3 s import here. A whole simulator job saved
    # -1 to 12 % CPU time per pair of runs, within this box's noise (docs/TESTING.md, session 36).
    # git ignores __pycache__.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": ""}
    job.proc = subprocess.Popen([sys.executable, "-m", "pytest", *job.args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    job.started = time.monotonic() - t0
    job.relay = threading.Thread(target=_relay, args=(job, lock), daemon=True)
    job.relay.start()
    with lock:
        print(f"[{job.name}] started at {job.started:.0f} s", flush=True)


def _next(pending: list[Job], running: list[Job]) -> Job | None:
    """The next job to start now, or None: three at once, at most two of them starting vLLM; the quiet
    jobs once every other job has started, while at most one other still runs (two jobs, two cores)."""
    loud = [j for j in pending if not j.quiet]
    if loud:
        if len(running) >= SLOTS:
            return None
        vllm_busy = sum(j.vllm for j in running)
        return next((j for j in loud if not j.vllm or vllm_busy < VLLM_SLOTS), None)
    return pending[0] if pending and len(running) <= 1 else None


def _stop_jobs(running: list[Job]) -> None:
    """SIGINT first (pytest ends its session and its fixtures' servers), then SIGTERM, then SIGKILL, each
    to the job's whole group: a job started from a background shell ignores SIGINT, and one stuck in a
    test may ignore both."""
    for sig, grace_s in ((signal.SIGINT, 30.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        live = [j.proc for j in running if j.proc is not None and j.proc.poll() is None]
        for proc in live:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def main(argv: list[str]) -> int:
    t0 = time.monotonic()
    lock = threading.Lock()
    fast = "--fast" in argv
    argv = [a for a in argv if a != "--fast"]
    pending, running, done = (fast_jobs(argv) if fast else jobs(argv)), [], []
    # a SIGTERM (a CI timeout, `kill`) ends the jobs as Ctrl-C does: each is a process group of its own,
    # which a signal to this process alone would leave running with its servers (SIGINT too: a shell
    # starts a background job with it ignored)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.default_int_handler)
    try:
        while pending or running:
            while (job := _next(pending, running)) is not None:
                pending.remove(job)
                _start(job, lock, t0)
                running.append(job)
            # whichever job ends next (this process has no other children), with its CPU seconds: its own
            # and those of every process it reaped (servers, runs)
            pid, status, usage = os.wait4(-1, 0)
            job = next((j for j in running if j.proc is not None and j.proc.pid == pid), None)
            if job is None:
                continue
            assert job.proc is not None
            job.proc.returncode = job.code = os.waitstatus_to_exitcode(status)
            job.ended, job.cpu = time.monotonic() - t0, usage.ru_utime + usage.ru_stime
            running.remove(job)
            done.append(job)
            if job.relay is not None:
                job.relay.join(timeout=10)
            with lock:
                print(f"[{job.name}] ended: exit {job.code}, {job.ended - job.started:.0f} s "
                      f"({job.started:.0f}-{job.ended:.0f} s), {job.cpu:.0f} CPU s", flush=True)
    except KeyboardInterrupt:
        _stop_jobs(running)
        return 2
    took = time.monotonic() - t0
    print("jobs (start-end s, wall s, CPU s, exit):")
    for job in sorted(done, key=lambda j: j.started):
        print(f"  {job.name:32} {job.started:5.0f}-{job.ended:5.0f} {job.ended - job.started:5.0f} "
              f"{job.cpu:6.0f}  {job.code}")
    failed = [j for j in done if j.code not in (0, 5)]
    # a skip is a test that did not check what it is for: named, so a run that skipped one says which
    for job in done:
        for line in job.skips:
            print(f"  [{job.name}] {line[:400]}")
    # CI keeps only the tail of what a run printed: each failure's test and first line of its message last
    for job in failed:
        for line in job.failures or [f"(no summary line: exit {job.code})"]:
            print(f"  [{job.name}] {line[:400]}")
    print(f"suite: {len(done)} jobs, {took:.0f} s in all, {sum(j.cpu for j in done):.0f} CPU s; "
          + (f"FAILED: {', '.join(j.name for j in failed)}" if failed else "all passed"))
    return failed[0].code if failed and failed[0].code is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
