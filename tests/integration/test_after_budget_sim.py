"""A study's after-budget steps (its confirmation, the daemon's report) as a job of the scheduler, on the
labelled simulator (real processes, HTTP and SQLite): the confirmation's repeats run inside a lease;
SIGTERM stops `run` at once in the middle of one and the next run finishes it; in the daemon, another
study's trials keep starting while a study confirms, and the finished study's report is written."""

from __future__ import annotations

import datetime as dt
import json
import signal
import sqlite3
import time
from pathlib import Path

import psutil
import pytest

from autotune.daemon.queue import StudyQueue
from autotune.engine.process import find_free_port

REPO = Path(__file__).resolve().parents[2]


def _q(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _confirming(lines: list[str]) -> bool:
    """A confirmation repeat is in its capacity search now (its server is up)."""
    heads = [i for i, line in enumerate(lines) if line.startswith("[confirm ")]
    return bool(heads) and any("capacity search" in line for line in lines[heads[-1] + 1:])


def test_run_confirms_inside_a_lease_and_sigterm_stops_it(autotune_run, servers_in, sim_spec,
                                                         tmp_path: Path) -> None:
    spec = sim_spec("conf", load={"requests_per_step": 200}, confirm={"enabled": True, "top_k": 1, "repeats": 3})
    db = tmp_path / "conf.db"
    args = ["run", "--study", str(spec), "--n-trials", "2", "--gpus", "0-1", "--parallel", "2", "--no-progress"]
    run = autotune_run(args, tmp_path)
    run.wait_for(_confirming, 240)
    servers = [pid for (pid,) in _q(db, "select pid from autotune_processes")]     # the repeats' servers
    signalled = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(60) == 143, "\n".join(run.lines)
    assert time.monotonic() - signalled < 20, "\n".join(run.lines)
    assert "stopped by SIGTERM" in run.lines[-1] and not any("Traceback" in line for line in run.lines), \
        "\n".join(run.lines)
    # two slots: up to two rounds run at once (a round's pair stays on one lease)
    assert 1 <= len(servers) <= 2 and not [p for p in servers if _alive(p)]
    assert not servers_in(tmp_path, "sim-serve")
    head = next(line for line in run.lines if line.startswith("confirmation: #"))
    total = 3 * head.split(" x ")[0].count("#")          # the baseline (+ the candidate, when it is feasible)
    kept = _q(db, "select count(*) from autotune_confirmations")[0][0]
    assert kept < total                                                     # cut in the middle
    assert _q(db, "select count(*) from trials where state = 'COMPLETE'") == [(2,)]

    # the same command: no new trial; the confirmation continues from the rows kept and finishes
    run = autotune_run(args, tmp_path)
    assert run.finish(300) == 0, "\n".join(run.lines)
    assert any(f"({total - kept} repeat(s) to run)" in line for line in run.lines), "\n".join(run.lines)
    assert _q(db, "select count(*) from trials where state = 'COMPLETE'") == [(2,)]
    rows = _q(db, "select lease, log_path from autotune_confirmations order by round, position")
    assert len(rows) == total
    for lease_json, log_path in rows:        # every repeat ran inside the job's lease: one virtual slot
        lease = json.loads(lease_json)
        assert lease["gpus"] == [] and len(lease["slots"]) == 1 and set(lease["slots"]) <= {0, 1}
        assert lease["cores"] and lease["port"] >= 1024
        assert Path(log_path).is_file() and Path(log_path).name.startswith("confirm-")
        heads = [line for line in Path(log_path).read_text().splitlines() if line.startswith("# autotune")]
        # its server was launched on the lease's port (a retry after a port taken from outside takes any)
        assert any(h.endswith(f"attempt 1, port {lease['port']}") for h in heads), heads
    assert not servers_in(tmp_path, "sim-serve")


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")
    monkeypatch.setenv("AUTOTUNE_HOST", "hostA")


def test_daemon_schedules_beside_a_confirmation_and_writes_the_report(env: None, autotune_run, servers_in,
                                                                       sim_spec, tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'q.db'}"
    for name, n, prio in (("a", "2", "5"), ("b", "40", "0")):
        spec = sim_spec(name, load={"requests_per_step": 16},
                        confirm={"enabled": name == "a", "top_k": 1, "repeats": 3})
        p = subprocess.run([sys.executable, "-m", "autotune", "submit", str(spec),
                            "--n-trials", n, "--priority", prio, "--storage", url],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    d = autotune_run(["daemon", "--gpus", "0-1", "--storage", url, "--poll", "0.5", "--grace", "0",
                      "--log-dir", str(tmp_path / "logs"),
                      "--listen", f"127.0.0.1:{find_free_port()}"], tmp_path)
    queue = StudyQueue(url, create=False)
    end = time.monotonic() + 300
    while queue.entry("a").state != "done":
        assert time.monotonic() < end and d.proc.poll() is None, "\n".join(d.lines[-40:])
        time.sleep(0.5)
    report = tmp_path / "logs" / "hostA" / "a" / "report.html"
    assert report.is_file() and "<html" in report.read_text().lower()
    assert any(line.endswith(f"a: report {report}") for line in d.lines), "\n".join(d.lines[-40:])
    d.proc.send_signal(signal.SIGTERM)
    assert d.finish(90) == 0, "\n".join(d.lines[-30:])
    assert not any("Traceback" in line for line in d.lines), "\n".join(d.lines)

    db = tmp_path / "q.db"
    window = _q(db, "select min(c.started_at), max(c.finished_at) from autotune_confirmations c "
                    "join autotune_studies s on s.id = c.study_id where s.name = 'a'")[0]
    repeats = _q(db, "select count(*) from autotune_confirmations c join autotune_studies s on s.id = c.study_id "
                     "where s.name = 'a'")[0][0]
    assert repeats in (3, 6)            # 3 rounds of the baseline, and of the candidate when it is feasible
    start, stop = _ts(window[0]), _ts(window[1])
    b_runs = [(_ts(t0), _ts(t1)) for t0, t1 in _q(db, "select t.started_at, t.finished_at from autotune_trials t "
                                                     "join autotune_studies s on s.id = t.study_id "
                                                     "where s.name = 'b' and t.lease is not null "
                                                     "and t.finished_at is not null")]
    beside = [(t0, t1) for t0, t1 in b_runs if t0 < stop and t1 > start]
    # each round of the confirmation holds one slot, so b runs beside it: a trial of b started in the
    # window, or one already running when the confirmation began (its rounds pack onto free slots, and
    # the second slot may be b's for the whole window)
    assert beside, (start, stop, b_runs)
    leases = [json.loads(x) for (x,) in _q(db, "select lease from autotune_confirmations")]
    assert all(len(x["slots"]) == 1 for x in leases)
    assert queue.entry("b").state == "queued"          # drained mid-study: the next daemon continues it
    assert not servers_in(tmp_path, "sim-serve")


def test_confirmation_rounds_run_at_once_on_free_slots_and_show_names_them(servers_in, sim_spec,
                                                                          tmp_path: Path) -> None:
    """Three free slots, three rounds: the rounds run at the same time, each on its own slot with its pair
    (the baseline and the candidate of that round share it), and `show` says where each repeat ran."""
    import subprocess
    import sys

    spec = sim_spec("pack", engine={"time_scale": 10}, load={"requests_per_step": 16},
                    confirm={"enabled": True, "top_k": 1, "repeats": 3})
    p = subprocess.run([sys.executable, "-m", "autotune", "run", "--study", str(spec), "--n-trials", "2",
                        "--gpus", "0-2", "--parallel", "3", "--no-progress"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    db = tmp_path / "pack.db"
    rows = _q(db, "select round, lease, started_at, finished_at from autotune_confirmations")
    rounds: dict[int, dict] = {}
    for r, lease, started, finished in rows:
        slots = tuple(json.loads(lease)["slots"])
        x = rounds.setdefault(r, {"slots": set(), "start": _ts(started), "end": _ts(finished)})
        x["slots"].add(slots)
        x["start"], x["end"] = min(x["start"], _ts(started)), max(x["end"], _ts(finished))
    assert sorted(rounds) == [0, 1, 2], rows
    assert all(len(x["slots"]) == 1 for x in rounds.values())           # a round's repeats: one lease
    assert len({next(iter(x["slots"])) for x in rounds.values()}) == 3   # three rounds, three slots
    overlapping = [(a, b) for a in rounds for b in rounds if a < b
                   and rounds[a]["start"] < rounds[b]["end"] and rounds[b]["start"] < rounds[a]["end"]]
    assert len(overlapping) == 3, rounds                                 # all at the same time
    show = subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", f"sqlite:///{db}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    slot = {r: next(iter(x["slots"]))[0] for r, x in rounds.items()}
    where = f"ran on r1 slot {slot[0]}, r2 slot {slot[1]}, r3 slot {slot[2]}"
    assert where in " ".join(show.stdout.split()), show.stdout          # (the table may wrap the line)
    assert not servers_in(tmp_path, "sim-serve")
