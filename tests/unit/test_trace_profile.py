"""The workload profile (bench/profile.py) and the canonical trace reader, on inputs whose answer is
known by construction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autotune.bench.profile import describe, format_profile
from autotune.bench.trace.format import read_trace
from autotune.bench.trace.prefix import shared_prefix_share
from autotune.bench.workloads import Prompt, parse_workload
from autotune.errors import UserError
from autotune.spec import StudySpec
from autotune.store.repository import ResultStore
from autotune.tuner.workload_profile import store_workload_profile


def test_prefix_share_counts_whole_blocks_of_the_longest_earlier_prefix() -> None:
    a = list(range(40))
    b = list(range(35)) + [999] * 5          # shares 35 units with a: two whole 16-blocks = 32
    c = list(range(100, 140))                 # shares nothing
    assert shared_prefix_share([a, b, c]) == pytest.approx(32 / 120)
    assert shared_prefix_share([a, a]) == pytest.approx(32 / 80)   # 40 = 2 whole blocks + 8


def test_profile_of_a_bursty_trace() -> None:
    rng = np.random.default_rng(0)
    times = np.sort(np.concatenate([b * 10.0 + rng.uniform(0, 0.2, 20) for b in range(6)]))
    prompts = [Prompt("w " * int(n), int(o), int(n), at_s=float(t)) for t, n, o in
               zip(times, rng.integers(10, 1000, 120), rng.integers(1, 300, 120))]
    d = describe(prompts, None)
    a = d["arrivals"]
    assert d["requests"] == 120 and a["interarrival_cv"] > 3           # bursts: far above Poisson's 1
    # a whole burst (20 requests) in one of 24 bins over the span, against 119 gaps over it: 20*24/119
    assert a["peak_to_mean"] == pytest.approx(20 * 24 / 119, rel=0.05) and sum(a["counts"]) == 120
    assert a["mean_rate"] == pytest.approx(119 / (times[-1] - times[0]))
    hist = d["input_tokens"]["hist"]
    assert sum(h[2] for h in hist) == 120 and all(h[1] == 2 * h[0] for h in hist)
    lowest = min(p.input_tokens for p in prompts)
    assert hist[0][0] <= lowest < hist[0][1] and hist[-1][0] <= d["input_tokens"]["max"] < hist[-1][1]
    text = format_profile(d)
    assert "bursty" in text and "120 requests" in text and "prefix" in text


def test_poisson_arrivals_read_as_poisson() -> None:
    t = np.cumsum(np.random.default_rng(1).exponential(0.1, 2000))
    d = describe([Prompt("x", 1, 1, at_s=float(x)) for x in t], None)
    assert d["arrivals"]["interarrival_cv"] == pytest.approx(1.0, abs=0.1)
    assert d["arrivals"]["mean_rate"] == pytest.approx(10, rel=0.1)


def test_synthetic_workloads_are_described_by_a_sample() -> None:
    d = describe(parse_workload("prefix:prefix_len=64,suffix_len=16,output_len=8").one_pass(None), None)
    assert "arrivals" not in d and d["output_tokens"]["p50"] == 8
    assert d["prefix_share_pct"] > 50      # 64 of ~80 words repeat the shared prefix (4 whole blocks)


def test_show_calls_a_synthetic_workloads_profile_a_sample_and_a_traces_its_requests(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"t": i, "output_tokens": 2, "input_tokens": 3}) + "\n" for i in range(24)))
    store = ResultStore(f"sqlite:///{tmp_path}/s.db")
    heads = {}
    for name, workload in (("synthetic", {"kind": "random", "input_len": 16, "output_len": 4}),
                           ("trace", {"kind": "trace", "path": str(trace)})):
        spec = StudySpec(name=name, model=str(tmp_path / "no-such-model"), workload=workload)
        study = store.ensure_study(name=name, model=spec.model, engine_kind="vllm", engine_command=["vllm"],
                                   fixed_flags=[], space_hash="h", spec_hash=name, spec={},
                                   objectives=[["output_tps", "maximize"]], slo="ttft:p99<=1s", quality_knobs=[])
        store_workload_profile(store, study.id, spec)
        heads[name] = format_profile(store.workload_profile(study.id)).splitlines()[0]
    # the study sends as many requests as its load asks: the profile is of a 100-prompt sample of them
    assert heads["synthetic"] == "workload: a sample of 100 requests"
    assert heads["trace"].startswith("workload: 24 requests, over 23.0 s")   # a trace's one pass is itself
    older = {k: v for k, v in store.workload_profile(1).items() if k != "sample"}   # stored before the key was
    assert format_profile(older).startswith("workload: a sample of 100 requests")


@pytest.mark.parametrize("line, message", [
    ({"output_tokens": 3, "input_tokens": 5}, "'t'"),
    ({"t": 1, "output_tokens": 0, "input_tokens": 5}, "output_tokens"),
    ({"t": 1, "output_tokens": 3}, "give 'prompt', 'messages' or 'input_tokens'"),
    ({"t": 1, "output_tokens": 3, "messages": [{"role": "user"}]}, "messages"),
])
def test_bad_trace_records_are_one_line_errors(tmp_path: Path, line: dict, message: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"t": 0, "output_tokens": 1, "input_tokens": 1}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(UserError, match="line 2") as e:
        read_trace(p)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_trace_workload_window_and_keys(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"t": i, "output_tokens": 2, "input_tokens": 3}) + "\n" for i in range(10)))
    w = parse_workload(f"trace:path={p},start=2,duration=5,time_scale=0.5")
    assert w.size == 5 and [x.at_s for x in w.one_pass(None)] == [0, 1, 2, 3, 4]
    assert parse_workload(w.params()).params() == w.params()
    with pytest.raises(UserError, match="time_scale must be > 0"):
        parse_workload(f"trace:path={p},time_scale=0")
    with pytest.raises(UserError, match="window holds no request"):
        parse_workload(f"trace:path={p},start=50")


def test_a_replay_behind_its_schedule_is_flagged_not_silent() -> None:
    from autotune.bench.replay import held_schedule
    from autotune.bench.results import ClientHealth

    ok = ClientHealth(note="event-loop lag p50 0.3 ms")
    late = {"p99_send_drift_ms": 30.0, "median_send_gap_ms": 50.0}
    assert held_schedule(ok, {"p99_send_drift_ms": 20.0, "median_send_gap_ms": 50.0}, "trace") == ok
    flagged = held_schedule(ok, late, "trace")
    assert flagged.saturated and "fell behind the trace: p99 30.0 ms" in flagged.note and "lag" in flagged.note
    assert held_schedule(ok, late, "rate") == ok            # a Poisson schedule has no recorded shape to keep
    assert held_schedule(ok, {"p99_send_drift_ms": 8.0, "median_send_gap_ms": 0.0}, "trace") == ok   # 10 ms floor


def test_capacity_by_time_scale_needs_a_trace_workload() -> None:
    from autotune.spec import build_spec

    with pytest.raises(UserError, match="time_scale scales a trace's rate"):
        build_spec({"name": "x", "model": "m", "load": {"search": "time_scale"}}, "spec")
    spec = build_spec({"name": "x", "model": "m", "workload": {"kind": "trace", "path": "t.jsonl"},
                       "load": {"search": "time_scale"}}, "spec")
    assert spec.load.search == "time_scale"
    # a fixed load without concurrency or rate: a trace replays at its times, anything else runs 8 in flight
    fixed = build_spec({"name": "x", "model": "m", "workload": {"kind": "trace", "path": "t.jsonl"},
                        "load": {"mode": "fixed"}}, "spec").load
    assert fixed.concurrency is None and fixed.rate is None
    assert build_spec({"name": "x", "model": "m", "load": {"mode": "fixed"}}, "spec").load.concurrency == 8
    from autotune.bench.replay import replay_rate
    with pytest.raises(UserError, match="needs a trace workload"):
        replay_rate(parse_workload("random:input_len=8,output_len=8"))


def test_the_profile_is_stored_with_the_study_and_old_databases_have_none(tmp_path: Path) -> None:
    import sqlite3

    from autotune.store.repository import ResultStore

    store = ResultStore(f"sqlite:///{tmp_path}/x.db")
    rec = store.ensure_study(name="s", model="m", engine_kind="sim", engine_command=[], fixed_flags=[], space_hash="h",
                             spec_hash="h", spec={}, objectives=[], slo="ttft=1s")
    assert store.workload_profile(rec.id) is None
    store.save_workload_profile(rec.id, {"requests": 3})
    store.save_workload_profile(rec.id, {"requests": 4})
    assert ResultStore(f"sqlite:///{tmp_path}/x.db", create=False).workload_profile(rec.id) == {"requests": 4}
    with sqlite3.connect(tmp_path / "x.db") as conn:       # a database written before profiles existed
        conn.execute("drop table autotune_workload_profiles")
    assert ResultStore(f"sqlite:///{tmp_path}/x.db", create=False).workload_profile(rec.id) is None
