"""Evidence tables, Pareto front, best trial and exports on a real SQLite file."""

import yaml

from autotune.export.formats import as_json, config_mapping, serve_command, vllm_yaml
from autotune.store.queries import best_trial, is_feasible, pareto_front
from autotune.store.repository import ResultStore
from autotune.tuner.verdict import quality_changes
from autotune.tuner.objectives import failure_constraints, measured_constraints, pick, placeholder_values
from autotune.slo import SLO


def _store(tmp_path):
    store = ResultStore(f"sqlite:///{tmp_path}/s.db")
    study = store.ensure_study(
        name="s", model="/m", engine_kind="vllm", engine_command=["vllm", "serve"],
        fixed_flags=["--max-model-len", "1024"], space_hash="h1", spec_hash="x", spec={"telemetry": {}},
        objectives=[["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]], slo="ttft:p99<=1000ms",
        quality_knobs=["kv_cache_dtype"])
    rows = [  # number, state, objectives, constraints, flags, params
        (0, "ok", {"capacity_tps": 100.0, "p50_tpot_ms": 10.0}, {"slo:ttft:p99": -5.0, "failure": 0.0}, [], {}),
        (1, "ok", {"capacity_tps": 200.0, "p50_tpot_ms": 20.0}, {"slo:ttft:p99": -1.0, "failure": 0.0},
         ["--max-num-seqs", "64", "--no-enable-prefix-caching"], {"max_num_seqs": 64, "enable_prefix_caching": False}),
        (2, "ok", {"capacity_tps": 150.0, "p50_tpot_ms": 25.0}, {"slo:ttft:p99": -1.0, "failure": 0.0}, [], {}),
        (3, "infeasible", {"capacity_tps": 900.0, "p50_tpot_ms": 5.0}, {"slo:ttft:p99": 50.0, "failure": 0.0}, [], {}),
        (4, "failed", {}, {"slo:ttft:p99": 0.0, "failure": 1.0}, ["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}),
        (5, "ok", {"capacity_tps": 200.0, "p50_tpot_ms": 20.0}, {"slo:ttft:p99": -1.0, "failure": 0.0},
         ["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}),
    ]
    for n, state, obj, cons, flags, params in rows:
        store.save_trial(study.id, n, optuna_trial_id=n, state=state, objectives=obj, constraints=cons,
                         flags=flags, params=params, spec_hash="x",
                         metrics={"p99_ttft_ms": 900.0 if n == 1 else 950.0}, cause="startup_oom" if n == 4 else None)
    return store, study


def test_feasibility_front_and_best(tmp_path):
    store, study = _store(tmp_path)
    trials = store.trials(study.id)
    assert [t.number for t in trials if is_feasible(t)] == [0, 1, 2, 5]
    front = {t.number for t in pareto_front(study, trials)}
    assert front == {0, 1, 5}          # 2 is dominated by 1; 3 infeasible; 4 failed
    best = best_trial(study, trials)
    assert best.number == 1            # ties with 5 on capacity; lower p99 TTFT wins


def test_resumed_study_with_another_space_is_refused(tmp_path):
    import pytest
    from autotune.errors import UserError
    store, _ = _store(tmp_path)
    with pytest.raises(UserError, match="another search space"):
        store.ensure_study(name="s", model="/m", engine_kind="vllm", engine_command=[], fixed_flags=[],
                           space_hash="h2", spec_hash="x", spec={}, objectives=[], slo="")


def test_vllm_yaml_writes_off_booleans_as_no_flags(tmp_path):
    store, study = _store(tmp_path)
    t1 = store.trial(study.id, 1)
    cfg = config_mapping(study, t1)
    assert cfg == {"model": "/m", "max-model-len": 1024, "max-num-seqs": 64, "no-enable-prefix-caching": True}
    text = vllm_yaml(study, t1)
    assert yaml.safe_load(text) == cfg and "WARNING" not in text
    t5 = store.trial(study.id, 5)
    quality = quality_changes(study, t5, store.trial(study.id, 0))
    assert quality == {"kv_cache_dtype": "fp8"} and quality_changes(study, t1, store.trial(study.id, 0)) == {}
    assert "changes output quality: kv_cache_dtype=fp8 (quality knobs the study opted into)" in \
        vllm_yaml(study, t5, quality=quality)
    assert serve_command(study, t1).strip() == \
        "vllm serve /m --max-model-len 1024 --max-num-seqs 64 --no-enable-prefix-caching"
    assert '"quality_changes": {\n    "kv_cache_dtype": "fp8"\n  }' in as_json(study, t5, quality=quality)


def test_series_kept_only_for_chosen_trials(tmp_path):
    store, study = _store(tmp_path)
    ids = {t.number: t.id for t in store.trials(study.id)}
    for n in (0, 1, 2):
        store.add_series(ids[n], "requests", [{"n": n}])
    store.keep_series_only_for(study.id, {ids[1]})
    assert store.series(ids[1], "requests") == [{"n": 1}]
    assert store.series(ids[0], "requests") is None and store.series(ids[2], "requests") is None


def test_process_records_round_trip(tmp_path):
    store, _ = _store(tmp_path)
    rid = store.register_process(study_name="s", pid=123, pgid=123, create_time=1.5, owner_pid=99, port=8000)
    assert [(p.pid, p.owner_pid) for p in store.processes("s")] == [(123, 99)]
    store.forget_process(rid)
    assert list(store.processes("s")) == []


def test_constraints_and_placeholders():
    slo = SLO.parse("ttft=1s,tpot:p50<=20ms")
    c = measured_constraints(slo, {"p99_ttft_ms": 800.0, "median_tpot_ms": 30.0}, -0.2, headroom=True)
    assert c == {"slo:ttft:p99": -200.0, "slo:tpot:p50": 10.0, "failure": 0.0, "headroom": -0.2}
    f = failure_constraints(slo, headroom=False)
    assert f == {"slo:ttft:p99": 0.0, "slo:tpot:p50": 0.0, "failure": 1.0}
    objectives = ["capacity_tps", "p50_tpot_ms"]
    assert placeholder_values(objectives, [[100.0, 10.0], [300.0, 40.0]]) == [100.0, 40.0]
    first = placeholder_values(objectives, [])
    assert first[0] == 0.0 and first[1] >= 1e9
    assert pick(objectives, {"capacity_tps": 5.0}) is None
    assert pick(objectives, {"capacity_tps": 5.0, "p50_tpot_ms": 2.0}) == [5.0, 2.0]
