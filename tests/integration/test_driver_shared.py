"""Several drivers (as several processes or hosts would) on one SQLite study: a stale trial is failed and re-queued once however many see it; a
host whose spec differs is refused; enqueues happen once; sampler seeds differ per process."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import text

from autotune.node.heartbeat import Heartbeats
from autotune.errors import UserError
from autotune.tuner.command import prepare_spec
from autotune.tuner.driver import StudyDriver, layout_gpus
from autotune.tuner.sharing import sampler_seed
from autotune.tuner.progress import Progress


def _raw(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    raw = {"name": "shared", "model": "llama-3.1-8b",
           "engine": {"kind": "sim", "gpu": "H100", "num_gpus": 1, "time_scale": 50},
           "workload": {"kind": "random", "input_len": 256, "output_len": 32}, "slo": "ttft:p99<=1s",
           "telemetry": {"source": "sim"}, "storage": f"sqlite:///{tmp_path}/s.db", "budget": {"n_trials": 4}}
    raw.update(extra)
    return raw


def _driver(tmp_path: Path, host: str, **extra: Any) -> StudyDriver:
    parts = prepare_spec(_raw(tmp_path, **extra), "spec", None)
    return StudyDriver(**parts, host=host, progress=Progress("shared", ["capacity_tps"], 4, live=False))


def _open(driver: StudyDriver, interval_s: float = 0.2) -> StudyDriver:
    from autotune.store.repository import make_engine
    driver.heartbeats = Heartbeats(make_engine(driver.spec.storage_url), interval_s=interval_s, host=driver.host)
    driver.open()
    return driver


def test_a_stale_trial_is_requeued_once_when_many_see_it(tmp_path: Path) -> None:
    owner = _open(_driver(tmp_path, "host-dead"))
    job = owner.next_job()                                  # the baseline, now RUNNING with a heartbeat
    assert job is not None and job.role == "baseline"
    with owner.store.engine.begin() as conn:                # its owner stops beating 10 s ago (DB clock)
        conn.execute(text("update autotune_heartbeats set beat_at = strftime('%Y-%m-%d %H:%M:%f', 'now', "
                          "'-10 seconds') where kind = 'trial'"))
    watchers = [_open(_driver(tmp_path, f"host-{i}")) for i in range(4)]
    barrier = threading.Barrier(len(watchers))
    errors: list[BaseException] = []

    def watch(d: StudyDriver) -> None:
        try:
            barrier.wait()
            d.recover()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=watch, args=(d,)) for d in watchers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    study = optuna.load_study(study_name="shared", storage=owner.spec.storage_url)
    trials = study.get_trials(deepcopy=False)
    assert trials[job.number].state == TrialState.FAIL
    requeued = [t for t in trials if t.user_attrs.get("requeued_from") == job.number]
    assert len(requeued) == 1 and requeued[0].state == TrialState.WAITING
    assert requeued[0].system_attrs["fixed_params"] == job.params
    assert owner.store.trial(owner.record.id, job.number).state == "interrupted"
    # The owner was only cut off: it learns that the trial is no longer its own.
    assert owner.still_ours(job) is False
    for d in [owner, *watchers]:
        d.heartbeats.stop()


def test_a_trial_measured_but_not_told_is_told_from_its_evidence_not_run_again(tmp_path: Path) -> None:
    """The owner saves its evidence, then stops beating before Optuna hears (CI saw a SIGKILL land there:
    the trial was re-run and the table said 'ok' where Optuna said FAIL). A watcher tells Optuna from the
    saved row; the owner, alive after all, finds the trial told and leaves its row as it was."""
    from autotune.tuner.trial import TrialOutcome
    owner = _open(_driver(tmp_path, "host-slow"))
    watcher = _open(_driver(tmp_path, "host-watch"))
    job = owner.next_job()
    assert job is not None
    save = owner.store.save_trial

    def save_then_be_judged_dead(study_id: int, number: int, **fields: Any) -> Any:
        out = save(study_id, number, **fields)
        if "objectives" in fields:                          # the finishing write, before the tell
            with owner.store.engine.begin() as conn:
                conn.execute(text("update autotune_heartbeats set beat_at = strftime('%Y-%m-%d %H:%M:%f', "
                                  "'now', '-10 seconds') where kind = 'trial'"))
            watcher.recover()
        return out

    owner.store.save_trial = save_then_be_judged_dead     # type: ignore[method-assign]
    observed = {"capacity_tps": 1500.0, "p50_tpot_ms": 6.0, "p99_ttft_ms": 400.0}
    owner.finish(job, None, TrialOutcome("ok", observed=observed, metrics={"p99_ttft_ms": 400.0}))
    study = optuna.load_study(study_name="shared", storage=owner.spec.storage_url)
    trials = study.get_trials(deepcopy=False)
    told = trials[job.number]
    assert told.state == TrialState.COMPLETE
    assert told.values == [observed[name] for name in owner.spec.objectives]
    assert told.constraints == {"slo:ttft:p99": -600.0, "failure": 0.0}    # 400 ms measured, 1 s allowed
    assert not [t for t in trials if t.user_attrs.get("requeued_from") == job.number]
    rec = owner.store.trial(owner.record.id, job.number)
    assert rec.state == "ok" and rec.objectives == {k: observed[k] for k in owner.spec.objectives}
    for d in (owner, watcher):
        d.heartbeats.stop()


def test_a_trial_asked_but_never_written_is_recorded_interrupted_and_requeued(tmp_path: Path) -> None:
    """Killed between Optuna's ask and the first write of its row: the watcher re-queues the parameters
    and writes the row, so the table accounts for every trial number (nothing ran)."""
    owner = _open(_driver(tmp_path, "host-dead"))
    watcher = _open(_driver(tmp_path, "host-watch"))

    class Killed(BaseException):
        pass

    def die(*args: Any, **kwargs: Any) -> Any:
        raise Killed

    owner.store.save_trial = die                            # type: ignore[method-assign]
    with pytest.raises(Killed):
        owner.next_job()
    with owner.store.engine.begin() as conn:
        conn.execute(text("update autotune_heartbeats set beat_at = strftime('%Y-%m-%d %H:%M:%f', 'now', "
                          "'-10 seconds') where kind = 'trial'"))
    watcher.recover()
    study = optuna.load_study(study_name="shared", storage=owner.spec.storage_url)
    trials = study.get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL
    assert [t.number for t in trials if t.user_attrs.get("requeued_from") == 0] == [1]
    rec = watcher.store.trial(watcher.record.id, 0)
    assert rec is not None and rec.state == "interrupted" and rec.role == "baseline" and rec.flags == []
    assert rec.host == "host-dead"                          # from the trial's heartbeat
    assert "before the trial was launched" in rec.detail
    for d in (owner, watcher):
        d.heartbeats.stop()


def test_a_trial_whose_first_write_met_a_database_restart_is_let_go_and_requeued(tmp_path: Path) -> None:
    """The owner lives on, but the database went away between Optuna's ask and the row's write (the
    soak's PostgreSQL restart): the owner must stop beating for that trial, or it stays RUNNING for good
    and its study never finishes. Its own recovery then re-queues it."""
    from sqlalchemy.exc import OperationalError

    owner = _open(_driver(tmp_path, "host-alive"))
    write = owner.store.save_trial
    calls = []

    def restart_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise OperationalError("insert", {}, Exception("connection refused"))
        return write(*args, **kwargs)

    owner.store.save_trial = restart_once                   # type: ignore[method-assign]
    try:
        with pytest.raises(OperationalError):
            owner.next_job()
        study = optuna.load_study(study_name="shared", storage=owner.spec.storage_url)
        deadline = time.monotonic() + 60                    # a cap, not a clock: we wait for the re-queue
        while not [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("requeued_from") == 0]:
            assert time.monotonic() < deadline, "the trial asked before the failed write was never re-queued"
            owner.recover()
            time.sleep(0.1)
        trials = study.get_trials(deepcopy=False)
        assert trials[0].state == TrialState.FAIL
        rec = owner.store.trial(owner.record.id, 0)
        assert rec is not None and rec.state == "interrupted" and rec.role == "baseline"
        job = owner.next_job()                              # the re-queued baseline is what runs next
        assert job is not None and job.role == "baseline" and job.number == 1
    finally:
        owner.heartbeats.stop()


def test_the_baseline_and_spec_candidates_are_enqueued_once(tmp_path: Path) -> None:
    extra = {"enqueue": [{"max_num_seqs": 64}]}
    drivers = [_open(_driver(tmp_path, f"h{i}", **extra)) for i in range(3)]
    study = optuna.load_study(study_name="shared", storage=drivers[0].spec.storage_url)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["role"] for t in waiting) == ["baseline", "enqueued"]
    for d in drivers:
        d.heartbeats.stop()


def test_a_host_with_another_spec_is_refused_with_one_line(tmp_path: Path) -> None:
    first = _open(_driver(tmp_path, "h1"))
    assert first.next_job() is not None                     # a trial stamped with the study's identity
    other = _driver(tmp_path, "h2", workload={"kind": "random", "input_len": 999, "output_len": 32})
    with pytest.raises(UserError) as e:
        _open(other)
    assert "spec" in str(e.value) and "\n" not in str(e.value)
    same_but_other_gpus = _open(_driver(tmp_path, "h3", gpus=[4, 5]))   # its own pool is fine
    for d in (first, same_but_other_gpus):
        d.heartbeats.stop()
    if other.heartbeats is not None:
        other.heartbeats.stop()


def test_each_process_seeds_its_sampler_differently() -> None:
    seeds = {sampler_seed(0, "a", 1, 0), sampler_seed(0, "a", 2, 0), sampler_seed(0, "b", 1, 0),
             sampler_seed(0, "a", 1, 5), sampler_seed(1, "a", 1, 0)}
    assert len(seeds) == 5 and sampler_seed(0, "a", 1, 0) == sampler_seed(0, "a", 1, 0)


@pytest.mark.parametrize("flags,n", [([], 1), (["--tensor-parallel-size", "2"], 2),
                                     (["--tensor-parallel-size=4", "--data-parallel-size", "2"], 8),
                                     (["--pipeline-parallel-size", "2", "--tensor-parallel-size", "2"], 4),
                                     (["--tensor-parallel-size", "8", "--tensor-parallel-size", "2"], 2)])
def test_the_layout_decides_how_many_gpus_a_trial_leases(flags: list[str], n: int) -> None:
    assert layout_gpus(flags) == n


def test_leftover_servers_are_stopped_only_on_their_host_and_only_when_their_owner_is_dead(tmp_path: Path) -> None:
    import subprocess
    import sys

    import psutil

    from autotune.engine.process import spawn, stop_group

    driver = _open(_driver(tmp_path, "here"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_created = psutil.Process(dead.pid).create_time()
    dead.wait()
    servers = {name: spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / f"{name}.log")
               for name in ("mine-dead-owner", "other-host", "live-owner")}
    owners = {"mine-dead-owner": ("here", dead.pid, dead_created), "other-host": ("there", dead.pid, dead_created),
              "live-owner": ("here", psutil.Process().pid, psutil.Process().create_time())}
    try:
        for name, popen in servers.items():
            host, owner, owner_created = owners[name]
            driver.store.register_process(study_name="shared", pid=popen.pid, pgid=popen.pid,
                                          create_time=psutil.Process(popen.pid).create_time(), owner_pid=owner,
                                          port=1, host=host, owner_create_time=owner_created)
        driver.recover()
        servers["mine-dead-owner"].wait(timeout=15)
        assert servers["other-host"].poll() is None and servers["live-owner"].poll() is None
        left = {p.host for p in driver.store.processes("shared")}
        assert left == {"there", "here"} and len(list(driver.store.processes("shared"))) == 2
    finally:
        for popen in servers.values():
            stop_group(popen.pid, popen.pid, grace_s=2, popen=popen)
        driver.heartbeats.stop()


def test_processes_creating_one_fresh_database_at_once_all_succeed(tmp_path: Path) -> None:
    """Without the retry, about half of four processes lose the race on CREATE / Optuna's version row."""
    import os
    import subprocess
    import sys

    code = ("import sys, optuna\nfrom autotune.tuner.sharing import first_to_create\n"
            "from autotune.store.repository import ResultStore\nurl = sys.argv[1]\n"
            "first_to_create(lambda: ResultStore(url))\n"
            "first_to_create(lambda: optuna.storages.RDBStorage(url, engine_kwargs={'connect_args': {'timeout': 30}}))\n"
            "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    url = f"sqlite:///{tmp_path}/fresh.db"
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [out.strip() for out, _ in results] == ["ok"] * 4, [err[-300:] for _, err in results]


def test_a_requeued_baseline_runs_before_the_candidates_queued_ahead_of_it(tmp_path: Path) -> None:
    """The baseline is cut (`--timeout`, SIGTERM, a drain: the scheduler's `interrupt`) while the spec's
    candidates wait; its parameters are re-queued behind them, yet the resumed study asks it first."""
    extra = {"enqueue": [{"max_num_seqs": 64}, {"max_num_seqs": 128}]}
    first = _open(_driver(tmp_path, "h1", **extra))
    job = first.next_job()
    assert job is not None and job.role == "baseline" and job.number == 0
    first.interrupt(job, "SIGTERM")
    first.heartbeats.stop()
    study = optuna.load_study(study_name="shared", storage=first.spec.storage_url)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.user_attrs["role"] for t in waiting] == ["enqueued", "enqueued", "baseline"]   # Optuna's order

    resumed = _open(_driver(tmp_path, "h1", **extra))
    jobs = [resumed.next_job() for _ in range(3)]
    assert [(j.role, j.params.get("max_num_seqs")) for j in jobs if j is not None] == \
        [("baseline", job.params["max_num_seqs"]), ("enqueued", 64), ("enqueued", 128)]
    assert jobs[0].trial.user_attrs["requeued_from"] == 0
    assert resumed.store.trial(resumed.record.id, 0).state == "interrupted"
    resumed.heartbeats.stop()
