"""The study queue (autotune_queue) and the spec a submit resolves: SQLite here; the same code runs
on PostgreSQL in tests/integration/test_daemon_postgres.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.daemon.queue import CANCELLED, DONE, QUEUED, StudyQueue
from autotune.daemon.resolve import FROM_DAEMON_ENV, resolve_spec_file, spec_for_daemon
from autotune.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def queue(tmp_path: Path) -> StudyQueue:
    return StudyQueue(f"sqlite:///{tmp_path / 'q.db'}")


def test_submit_orders_by_priority_then_time(queue: StudyQueue) -> None:
    queue.submit("low", {"name": "low"}, priority=0, n_trials=3, time_budget_s=None)
    queue.submit("high", {"name": "high"}, priority=5, n_trials=3, time_budget_s=None)
    queue.submit("low2", {"name": "low2"}, priority=0, n_trials=3, time_budget_s=None)
    assert [e.name for e in queue.entries((QUEUED,))] == ["high", "low", "low2"]


def test_submit_twice_while_queued_is_an_error_but_resubmit_after_cancel_works(queue: StudyQueue) -> None:
    queue.submit("s", {"name": "s"}, priority=0, n_trials=3, time_budget_s=10)
    with pytest.raises(UserError, match="already queued"):
        queue.submit("s", {"name": "s"}, priority=0, n_trials=3, time_budget_s=10)
    e = queue.cancel("s", now=True)
    assert (e.state, e.cancel_now) == (CANCELLED, True)
    with pytest.raises(UserError, match="not queued"):
        queue.cancel("s")
    again = queue.submit("s", {"name": "s"}, priority=2, n_trials=5, time_budget_s=10)
    assert (again.state, again.cancel_now, again.priority, again.n_trials) == (QUEUED, False, 2, 5)


def test_cancel_unknown_names_what_is_there(queue: StudyQueue) -> None:
    queue.submit("a", {"name": "a"}, priority=0, n_trials=1, time_budget_s=None)
    with pytest.raises(UserError, match=r"no study named 'b' in the queue \(there: a\)"):
        queue.cancel("b")


def test_finish_happens_once(queue: StudyQueue) -> None:
    queue.submit("s", {"name": "s"}, priority=0, n_trials=1, time_budget_s=None)
    assert queue.finish("s", "1 trial(s) complete") is True
    assert queue.finish("s", "again") is False
    e = queue.entry("s")
    assert e is not None and (e.state, e.reason) == (DONE, "1 trial(s) complete")


def test_tick_counts_time_across_daemons_once_and_caps_gaps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    a, b = StudyQueue(url), StudyQueue(url)   # two daemons on one database
    a.submit("s", {"name": "s"}, priority=0, n_trials=1, time_budget_s=100)
    assert a.tick("s", cap_s=5, now=1000.0) == 0.0          # first tick starts the clock
    assert b.tick("s", cap_s=5, now=1002.0) == 2.0          # b counts since a's tick
    assert a.tick("s", cap_s=5, now=1003.0) == 3.0          # a counts since b's, not since its own
    assert b.tick("s", cap_s=5, now=1100.0) == 8.0          # a gap (no daemon ran it) counts at most cap
    e = StudyQueue(url).entry("s")                           # a restarted daemon reads the total
    assert e is not None and e.seconds_used == 8.0 and e.budget_left_s() == 92.0


def test_resolve_inlines_the_space_drops_storage_and_warns(tmp_path: Path) -> None:
    spec = yaml.safe_load((REPO / "studies" / "sim-h100-9b.yaml").read_text())
    spec["search_space"] = "space.yaml"                      # a file beside the spec
    spec["budget"] = {"n_trials": 7, "timeout": "2m"}
    spec["engine"]["env"] = {"HF_TOKEN": "hf_secret", "VLLM_LOGGING_LEVEL": "DEBUG"}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"params": {"max_num_seqs": {
        "type": "int", "low": 16, "high": 256, "log": True, "default": 64}}}))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    warned: list[str] = []
    r = resolve_spec_file(str(path), n_trials=4, warn=warned.append)
    assert (r.name, r.n_trials, r.time_budget_s) == ("sim-h100-9b", 4, 120.0)
    assert r.spec["storage"] is None
    assert r.spec["search_space"]["params"]["max_num_seqs"]["high"] == 256
    assert r.spec["engine"]["env"] == {"HF_TOKEN": FROM_DAEMON_ENV, "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert "hf_secret" not in str(r.spec)
    assert len(warned) == 1 and "storage sqlite:///studies/sim-h100-9b.db ignored" in warned[0]

    raw = spec_for_daemon(r.spec, "sqlite:///d.db", 4, {"HF_TOKEN": "hf_daemon"})
    assert raw["engine"]["env"]["HF_TOKEN"] == "hf_daemon" and raw["storage"] == "sqlite:///d.db"
    with pytest.raises(UserError, match="needs HF_TOKEN in the daemon's environment"):
        spec_for_daemon(r.spec, "sqlite:///d.db", 4, {})


def test_resolve_makes_a_local_model_absolute(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "x", "model": "m", "search_space": "cpu"}))
    r = resolve_spec_file(str(tmp_path / "s.yaml"))
    assert r.spec["model"] == str((tmp_path / "m").resolve())
    assert r.n_trials == 30 and r.time_budget_s is None


def test_submit_to_checks_what_a_client_posts(tmp_path: Path) -> None:
    """POST /submit reaches the same function as `submit --storage`: a body that is not a valid
    resolved spec is a one-line error, and nothing is queued."""
    from autotune.daemon.queue import submit_to

    url = f"sqlite:///{tmp_path / 'q.db'}"
    with pytest.raises(UserError, match="needs name and spec"):
        submit_to(url, {"name": "x"})
    with pytest.raises(UserError, match="SLO term .nonsense. is malformed"):
        submit_to(url, {"name": "x", "spec": {"name": "x", "model": "m", "slo": "nonsense"}, "n_trials": 2})
    r = resolve_spec_file(str(REPO / "studies" / "sim-h100-9b.yaml"), n_trials=2)
    with pytest.raises(UserError, match="must be numbers"):
        submit_to(url, {"name": r.name, "spec": r.spec, "n_trials": "many"})
    assert StudyQueue(url).entries() == []
    assert submit_to(url, {"name": r.name, "spec": r.spec, "n_trials": 2, "priority": 3}) == \
        {"queued": r.name, "priority": 3, "n_trials": 2}
