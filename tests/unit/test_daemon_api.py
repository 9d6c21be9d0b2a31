"""The daemon's status API on a real loopback socket: the listen rules, the bearer token, the
Prometheus text, and password masking."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import pytest

from autotune.daemon.api import StatusServer, check_listen, read_token
from autotune.daemon.metrics import BusyClock, Reading, registry_for, render
from autotune.errors import UserError
from autotune.store.models import TrialRecord
from autotune.store.urls import mask_url


def test_listen_rules() -> None:
    assert check_listen("127.0.0.1:8321", None) == ("127.0.0.1", 8321)
    assert check_listen("[::1]:9", None) == ("::1", 9)
    assert check_listen("8321", None) == ("127.0.0.1", 8321)
    assert check_listen("0.0.0.0:8321", "t") == ("0.0.0.0", 8321)
    with pytest.raises(UserError, match="needs a token") as e:
        check_listen("0.0.0.0:8321", None)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="HOST:PORT"):
        check_listen("127.0.0.1:http", None)


def test_token_from_file_or_environment(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text("s3cret\n")
    assert read_token(str(f), {}) == "s3cret"
    assert read_token(None, {"AUTOTUNE_TOKEN": "env-tok"}) == "env-tok"
    assert read_token(None, {}) is None
    with pytest.raises(UserError, match="cannot read"):
        read_token(str(tmp_path / "missing"), {})


def test_server_requires_the_bearer_token_and_serves_both_endpoints() -> None:
    seen: list[dict] = []

    def cancel(body: dict) -> dict:
        if body.get("name") != "s":
            raise UserError("no such study")
        seen.append(body)
        return {"cancelled": body["name"]}

    server = StatusServer("127.0.0.1", 0, "tok", status=lambda: {"studies": [], "gpus": []},
                          metrics=lambda: "autotune_x 1\n", actions={"cancel": cancel})
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{base}/status").status_code == 401
        assert httpx.get(f"{base}/status", headers={"Authorization": "Bearer nope"}).status_code == 401
        auth = {"Authorization": "Bearer tok"}
        assert httpx.get(f"{base}/status", headers=auth).json() == {"studies": [], "gpus": []}
        r = httpx.get(f"{base}/metrics", headers=auth)
        assert r.text == "autotune_x 1\n" and r.headers["content-type"].startswith("text/plain")
        assert httpx.post(f"{base}/cancel", json={"name": "s"}, headers=auth).json() == {"cancelled": "s"}
        bad = httpx.post(f"{base}/cancel", json={"name": "zz"}, headers=auth)
        assert bad.status_code == 400 and bad.json() == {"error": "no such study"}
        assert seen == [{"name": "s"}]
    finally:
        server.stop()


def _trial(n: int, state: str, cause: str | None, seconds: float | None) -> TrialRecord:
    t0 = dt.datetime(2026, 1, 1)
    return TrialRecord(number=n, state=state, cause=cause, started_at=t0,
                       finished_at=None if seconds is None else t0 + dt.timedelta(seconds=seconds))


def test_prometheus_text() -> None:
    """The daemon's registry, read back by prometheus-client's own parser (what a scraper sees)."""
    from prometheus_client.parser import text_string_to_metric_families

    t4 = _trial(4, "ok", None, 20)
    t4.client = {"pid": 1, "cpu_s": 4.0, "wall_s": 16.0, "cpu_share": 0.25}
    trials = {"s": [_trial(0, "ok", None, 40), _trial(1, "failed", "startup_oom", 10),
                    _trial(2, "ok", None, 200), _trial(3, "running", None, None), t4]}
    reading = Reading(trials, {0: 12.5, 1: 0.0}, "h1", queue_states={"queued": 1}, draining=False, uptime_s=50.0,
                      running=1)
    text = render(registry_for(lambda: reading))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("autotune_trials", study="s", state="ok", cause="") == 3
    assert value("autotune_trials", study="s", state="failed", cause="startup_oom") == 1
    assert value("autotune_trials", study="s", state="running", cause="") == 1
    assert value("autotune_gpu_busy_seconds_total", host="h1", gpu="0") == 12.5
    assert value("autotune_slot_busy_ratio", host="h1", gpu="0") == 0.25
    assert value("autotune_trial_duration_seconds_bucket", study="s", le="15.0") == 1
    assert value("autotune_trial_duration_seconds_bucket", study="s", le="60.0") == 3
    assert value("autotune_trial_duration_seconds_bucket", study="s", le="+Inf") == 4
    assert value("autotune_trial_duration_seconds_sum", study="s") == 270.0
    assert value("autotune_trial_client_cpu_seconds_count", study="s") == 1
    assert value("autotune_trial_client_cpu_share_bucket", study="s", le="0.25") == 1
    assert value("autotune_running_jobs", host="h1") == 1 and value("autotune_queue_studies", state="queued") == 1
    assert "# TYPE autotune_trial_duration_seconds histogram" in text
    # the exact lines the multi-host test matches on (prometheus-client writes labels sorted by name)
    assert 'autotune_trials{cause="startup_oom",state="failed",study="s"} 1.0' in text.splitlines()
    assert 'autotune_trial_duration_seconds_count{study="s"} 4.0' in text.splitlines()


def test_busy_clock() -> None:
    c = BusyClock([0, 1])
    c.update({0}, now=10.0)
    c.update({0, 1}, now=12.0)
    c.update({1}, now=15.0)
    assert c.seconds(now=16.0) == {0: 5.0, 1: 4.0}


def test_mask_url() -> None:
    assert mask_url("postgresql+psycopg://me:pa:ss@db:5432/x") == "postgresql+psycopg://me:***@db:5432/x"
    assert mask_url("error at postgresql://u:p@h/d: refused") == "error at postgresql://u:***@h/d: refused"
    assert mask_url("postgresql+psycopg://me@db/x") == "postgresql+psycopg://me@db/x"
    assert mask_url("sqlite:///studies/x.db") == "sqlite:///studies/x.db"
