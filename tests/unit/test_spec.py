import sys

import pytest

from autotune.errors import UserError
from autotune.spec import StudySpec, build_spec, check_engine_command, check_model, parse_duration


def test_defaults_and_storage_name():
    spec = build_spec({"name": "a", "model": "org/model"}, "t")
    assert spec.storage_url == "sqlite:///studies/a.db"
    assert spec.objectives == ["capacity_tps", "p50_tpot_ms"] and spec.directions() == ["maximize", "minimize"]
    assert spec.load.mode == "capacity" and spec.telemetry.hz == 10


def test_identity_ignores_budget_storage_and_env():
    a = build_spec({"name": "a", "model": "o/m", "budget": {"n_trials": 3}}, "t")
    b = build_spec({"name": "a", "model": "o/m", "budget": {"n_trials": 50}, "storage": "sqlite:///x.db",
                    "engine": {"env": {"HF_TOKEN": "secret"}}}, "t")
    assert a.identity_hash() == b.identity_hash()
    c = build_spec({"name": "a", "model": "o/m", "slo": "ttft=2s"}, "t")
    assert c.identity_hash() != a.identity_hash()


def test_secrets_never_in_the_stored_spec():
    spec = build_spec({"name": "a", "model": "o/m", "engine": {"env": {"HF_TOKEN": "hf_abc123"}}}, "t")
    assert "hf_abc123" not in str(spec.public_dict())
    assert spec.public_dict()["engine"]["env"] == {"HF_TOKEN": "<redacted>"}


@pytest.mark.parametrize("raw,needle", [
    ({"name": "a", "model": "o/m", "objectives": ["speed"]}, "unknown objective 'speed'"),
    ({"name": "a", "model": "o/m", "slo": "ttft<=1s"}, "SLO term"),
    ({"name": "a", "model": "o/m", "load": {"max_steps": 0}}, "load.max_steps"),
    ({"name": "a", "model": "o/m", "engine": {"kind": "tgi"}}, "engine.kind"),
    ({"name": "a b", "model": "o/m"}, "name"),
    ({"name": "a", "model": "o/m", "budget": {"timeout": "forever"}}, "timeout"),
    ({"name": "a"}, "model"),
])
def test_bad_specs_are_one_line(raw, needle):
    with pytest.raises(UserError) as e:
        build_spec(raw, "spec.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_model_resolution(tmp_path, monkeypatch):
    (tmp_path / "models" / "m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    spec = check_model(build_spec({"name": "a", "model": "models/m"}, "t"))
    assert spec.model == str((tmp_path / "models" / "m").resolve())
    assert check_model(build_spec({"name": "a", "model": "meta-llama/Llama-3.1-8B"}, "t")).model == \
        "meta-llama/Llama-3.1-8B"
    for bad in ("./missing", "/abs/missing", "justaname"):
        with pytest.raises(UserError, match="neither a local model directory"):
            check_model(build_spec({"name": "a", "model": bad}, "t"))


def test_python_placeholder_and_missing_command():
    spec = build_spec({"name": "a", "model": "o/m", "engine": {"command": ["{python}", "-m", "vllm"]}}, "t")
    assert check_engine_command(spec)[0] == sys.executable
    spec = build_spec({"name": "a", "model": "o/m", "engine": {"command": ["/nope/vllm", "serve"]}}, "t")
    with pytest.raises(UserError, match="engine command not found"):
        check_engine_command(spec)


def test_durations():
    assert parse_duration("90s") == 90 and parse_duration("45m") == 2700 and parse_duration("8h") == 28800
    assert parse_duration(12) == 12.0
    with pytest.raises(UserError):
        parse_duration("-1h")


def test_shipped_studies_validate():
    from pathlib import Path
    from autotune.spec import load_spec_file
    for path in sorted(Path(__file__).resolve().parents[2].glob("studies/*.yaml")):
        if path.stem.endswith("-best"):
            continue   # an export `make run` wrote (git-ignored), not a study spec
        spec = build_spec(load_spec_file(path), str(path))
        assert isinstance(spec, StudySpec) and spec.name == path.stem


def test_spec_built_from_model_alone_on_a_cpu_host(tmp_path, monkeypatch):
    """`autotune run --slo ttft=1s --model DIR` with no spec file and no GPU: the CPU space, a light
    workload, and a memory fraction every trial can get (vLLM's 0.92 default fails beside others)."""
    import argparse

    from autotune.tuner import command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(command, "nvml_gpus", lambda: [])
    args = argparse.Namespace(study=None, model=str(tmp_path), slo="ttft=1s", study_name=None, storage=None,
                              gpus=None, engine_cmd=None, n_trials=2, timeout=None)
    raw, _ = command.raw_spec(args)
    spec = build_spec(command.apply_overrides(raw, args), "t")
    assert spec.search_space == "cpu" and spec.budget.n_trials == 2 and spec.slo == "ttft=1s"
    flags = spec.engine.extra_flags
    assert flags[flags.index("--gpu-memory-utilization") + 1] == "0.3"
    assert spec.name == f"tune-{tmp_path.name}"
