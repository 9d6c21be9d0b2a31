"""The daemon on one host, on SQLite and the labelled simulator: priorities, the time budget, cancel
--now through the API, and Ctrl-C draining mid-trial (real processes, real HTTP)."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from autotune.daemon.queue import StudyQueue
from autotune.engine.process import find_free_port

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, name: str, time_scale: float = 25, **budget: object) -> Path:
    spec = yaml.safe_load((REPO / "benchmarks" / "scale" / "scenario.yaml").read_text())
    spec["name"] = name
    spec["engine"]["time_scale"] = time_scale
    # confirmation off: these tests are about the queue, budgets and signals; a daemon running a study's
    # confirmation is tests/integration/test_after_budget_sim.py's
    spec["confirm"] = {"enabled": False}
    if budget:
        spec["budget"] = budget
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def _wait(pred, timeout: float, what: str, run=None) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, what + ("\n" + "\n".join(run.lines[-30:]) if run else "")
        time.sleep(0.5)


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")


def test_priority_time_budget_and_cancel_now(env: None, autotune_run, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    # low at 5x, not 25x: its trials last long enough that the cancel (a new process, a second or more on a
    # loaded box) lands while the trial still runs (seen in CI at 25x: it landed as the trial was ending)
    assert _cli("submit", str(_spec(tmp_path, "low", time_scale=5)), "--n-trials", "50", "--storage", url).returncode == 0
    assert _cli("submit", str(_spec(tmp_path, "high", timeout="8s")), "--n-trials", "50", "--priority", "5",
                "--storage", url).returncode == 0
    port = find_free_port()
    d = autotune_run(["daemon", "--gpus", "0", "--storage", url, "--poll", "0.5",
                      "--listen", f"127.0.0.1:{port}"], tmp_path)
    queue = StudyQueue(url, create=False)
    # high first, until its 8 s are spent; then it leaves the queue and low gets the GPU
    _wait(lambda: queue.entry("high").state == "done", 120, "high never left the queue", d)
    high = queue.entry("high")
    # it stops when the time left is spent or shorter than its median trial (the deadline rule)
    assert high.reason.startswith("time budget spent") and 2 < high.seconds_used < 8 + 5, \
        (high.reason, "\n".join(d.lines[-60:]))
    # low is asked for a candidate only once a slot is free (docs/SCHEDULER.md): high's last trial may
    # still be running when high leaves the queue, so low's first trial comes after it ends
    _wait(lambda: "low" in _order(tmp_path / "q.db"), 120, "low never started a trial", d)
    order = _order(tmp_path / "q.db")
    assert order[0] == "high" and order[: order.index("low")] == ["high"] * order.index("low")
    status_url = f"http://127.0.0.1:{port}/status"

    servers: list[psutil.Process] = []

    def low_in_load() -> bool:   # in its first load steps, with its server up (snapshotted in the same look)
        gpu = httpx.get(status_url).json()["gpus"][0]
        phase = gpu["phase"] or ""
        servers[:] = [p for p in psutil.Process(d.proc.pid).children(recursive=True)
                      if "sim-serve" in " ".join(p.cmdline())]
        return (gpu["study"] == "low" and bool(servers)
                and ("capacity search by concurrency" in phase or "capacity search: concurrency 1 ->" in phase))
    _wait(low_in_load, 120, "low never reached its load", d)

    r = _cli("cancel", "low", "--now", "--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 0 and "interrupted" in r.stdout, r.stderr
    assert servers and psutil.wait_procs(servers, timeout=30)[1] == []
    db = tmp_path / "q.db"
    _wait(lambda: _low_states(db)[0].count("interrupted") == 1, 60, "low's trial was not interrupted", d)
    assert queue.entry("low").state == "cancelled"
    # the scheduler lets go of low: an empty queue, and the daemon idle, not exited (four more polls)
    _wait(lambda: httpx.get(status_url).json()["scheduler"] == [], 60, "low was not let go", d)
    with pytest.raises(subprocess.TimeoutExpired):
        d.proc.wait(timeout=2)
    d.proc.send_signal(signal.SIGTERM)
    assert d.finish(60) == 0
    assert not any("Traceback" in line for line in d.lines)
    evidence, optuna_states = _low_states(db)
    # its parameters stay queued (WAITING) for a resubmit; nothing is left RUNNING
    assert "RUNNING" not in optuna_states and optuna_states.count("WAITING") >= evidence.count("interrupted")


def _order(db: Path) -> list[str]:
    """The study of each trial, by the time it started."""
    with sqlite3.connect(db) as conn:
        return [s for (s,) in conn.execute("select s.name from autotune_trials t join autotune_studies s "
                                           "on s.id = t.study_id order by t.started_at")]


def _low_states(db: Path) -> tuple[list[str], list[str]]:
    with sqlite3.connect(db) as conn:
        evidence = [s for (s,) in conn.execute("select t.state from autotune_trials t join autotune_studies s "
                                               "on s.id = t.study_id where s.name = 'low'")]
        optuna_states = [s for (s,) in conn.execute("select t.state from trials t join studies s "
                                                    "on s.study_id = t.study_id where s.study_name = 'low'")]
    return evidence, optuna_states


@pytest.mark.parametrize("sig,grace", [(signal.SIGINT, 0), (signal.SIGTERM, 120)])
def test_a_signal_drains_within_grace(sig: signal.Signals, grace: int, env: None, autotune_run, servers_in,
                                      tmp_path: Path) -> None:
    """Ctrl-C and SIGTERM drain alike: no new trials; the running ones finish within --grace, or are
    interrupted and re-queued when it runs out; exit 0 either way."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert _cli("submit", str(_spec(tmp_path, "s")), "--n-trials", "20", "--storage", url).returncode == 0
    d = autotune_run(["daemon", "--gpus", "0-1", "--storage", url, "--poll", "0.5", "--grace", str(grace),
                      "--listen", f"127.0.0.1:{find_free_port()}"], tmp_path)
    d.wait_for(lambda ls: sum("capacity search:" in line for line in ls) >= 1, 120)
    d.proc.send_signal(sig)
    assert d.finish(90) == 0, "\n".join(d.lines[-20:])
    assert any(f"{sig.name}: draining" in line for line in d.lines), "\n".join(d.lines[-30:])
    assert any(line.endswith("drained; exiting") for line in d.lines[-5:])
    assert not any("Traceback" in line for line in d.lines), "\n".join(d.lines)
    launched = {int(m[1]) for line in d.lines if (m := re.match(r"\s*\[trial (\d+)\] starting sim", line))}
    with sqlite3.connect(tmp_path / "q.db") as conn:
        states = dict(conn.execute("select number, state from autotune_trials").fetchall())
        requeued = conn.execute("select count(*) from trial_user_attributes where key = 'requeued_from'").fetchone()[0]
        running = conn.execute("select count(*) from trials where state = 'RUNNING'").fetchone()[0]
    cut = [n for n in launched if states[n] == "interrupted"]
    assert (len(cut) >= 1) if grace == 0 else (cut == [])   # with time to finish, no launched trial is cut
    assert requeued == sum(s == "interrupted" for s in states.values()) and running == 0
    assert not servers_in(tmp_path, "sim-serve")
    assert StudyQueue(url, create=False).entry("s").state == "queued"    # the next daemon continues it


def test_a_study_this_host_may_not_join_is_refused_and_stays_queued(env: None, autotune_run, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    port = find_free_port()
    d = autotune_run(["daemon", "--gpus", "0", "--storage", url, "--poll", "0.5",
                      "--listen", f"127.0.0.1:{port}"], tmp_path)
    d.wait_for(lambda ls: any("status on http" in line for line in ls), 60)
    assert _cli("submit", str(_spec(tmp_path, "s")), "--n-trials", "1", "--url", f"http://127.0.0.1:{port}") \
        .returncode == 0
    queue = StudyQueue(url, create=False)
    _wait(lambda: queue.entry("s").state == "done", 120, "the first submit did not finish", d)
    # the same study again, now on another (simulated) GPU model: its trials would not compare
    other = _spec(tmp_path, "s")
    spec = yaml.safe_load(other.read_text())
    spec["engine"]["gpu"] = "A100"
    other.write_text(yaml.safe_dump(spec))
    assert _cli("submit", str(other), "--n-trials", "3", "--storage", url).returncode == 0
    _wait(lambda: any("refused s:" in line for line in d.lines), 60, "not refused", d)
    line = next(line for line in d.lines if "refused s:" in line)
    assert "GPU model (simulated A100) differs" in line
    st = _cli("status", "--url", f"http://127.0.0.1:{port}")
    assert "s (SIMULATED): queued" in st.stdout and "refused on this host:" in st.stdout, st.stdout + st.stderr
    assert queue.entry("s").state == "queued" and d.proc.poll() is None     # left for hosts that may join
    d.proc.send_signal(signal.SIGTERM)
    assert d.finish(60) == 0
    assert not any("Traceback" in line for line in d.lines)
