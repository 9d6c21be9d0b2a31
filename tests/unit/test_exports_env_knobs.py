"""Environment-variable knobs in the DB, `show`, `diff` and every export format (the deploy kit's override
included), and the speculative-decoding label, on a real SQLite store (no server)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autotune.cli import main
from autotune.export.choice import exported_trial
from autotune.export.container import docker_argv
from autotune.export.deploy_kit import kit_files
from autotune.export.files import write_folder_atomic
from autotune.export.k8s import manifests
from autotune.export.options import ExportContext
from autotune.report.diff import compare
from autotune.report.html import render_report
from autotune.store.repository import ResultStore

ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'


def _store(tmp_path: Path, *, speculative: bool = False) -> tuple[ResultStore, object]:
    store = ResultStore(f"sqlite:///{tmp_path}/s.db")
    spec = {"workload": {"kind": "random", "input_len": 64, "output_len": 16}}
    if speculative:
        spec["speculative"] = {"enabled": True, "random_weights": True, "synthetic_prompts": True}
    study = store.ensure_study(
        name="envs", model="/models/m", engine_kind="vllm", engine_command=["vllm", "serve"],
        fixed_flags=["--max-model-len", "1024"], space_hash="h", spec_hash="x", spec=spec,
        objectives=[["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]], slo="ttft:p99<=1000ms",
        quality_knobs=[])
    best_flags = ["--max-num-seqs", "64"] + (["--speculative-config", NGRAM] if speculative else [])
    rows = [(0, "baseline", 100.0, [], {}, None, {}),
            (1, "search", 180.0, best_flags, {"max_num_seqs": 64, "cpu_kv_cache_space_gib": 2}, ENV,
             {"spec_acceptance_pct": 41.25, "spec_mean_accepted": 1.24} if speculative else {})]
    for n, role, cap, flags, params, env, extra in rows:
        store.save_trial(study.id, n, optuna_trial_id=n, role=role, state="ok", flags=flags, params=params, env=env,
                         objectives={"capacity_tps": cap, "p50_tpot_ms": 20.0},
                         constraints={"slo:ttft:p99": -10.0, "failure": 0.0},
                         capacity={"mode": "concurrency", "capacity": 10.0, "steps": []},
                         metrics={"p99_ttft_ms": 900.0, "median_tpot_ms": 20.0, **extra}, engine_version="0.24.0",
                         spec_hash="x", hardware={"gpus": [{"index": 0, "name": "H200"}]},
                         workload={"kind": "random", "input_len": 64, "output_len": 16})
    return store, store.resolve_study(None)


def _ctx(store, study) -> ExportContext:
    trials = store.trials(study.id)
    return ExportContext(store, study, trials, exported_trial(study, trials).trial)


def _export(store, fmt: str, out: Path) -> str:
    assert main(["export", "--storage", store.url, "--format", fmt, "-o", str(out)]) == 0
    return out.read_text()


def test_env_knobs_reach_every_export_format(tmp_path):
    store, study = _store(tmp_path)
    text = _export(store, "vllm-yaml", tmp_path / "best.yaml")
    assert "#   export VLLM_CPU_KVCACHE_SPACE=2" in text
    assert yaml.safe_load(text) == {"model": "/models/m", "max-model-len": 1024, "max-num-seqs": 64}  # not a flag
    command = _export(store, "command", tmp_path / "cmd.sh").strip().splitlines()[-1]
    assert shlex.split(command)[:3] == ["VLLM_CPU_KVCACHE_SPACE=2", "vllm", "serve"]
    doc = json.loads(_export(store, "json", tmp_path / "best.json"))
    assert doc["env"] == ENV and "VLLM_CPU_KVCACHE_SPACE" not in " ".join(doc["flags"])
    argv = docker_argv(_ctx(store, study))
    image = argv.index("vllm/vllm-openai:v0.24.0")
    assert argv[image - 2:image] == ["-e", "VLLM_CPU_KVCACHE_SPACE=2"]
    assert "VLLM_CPU_KVCACHE_SPACE=2" in _export(store, "docker", tmp_path / "run.sh")
    container = manifests(_ctx(store, study))[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "2"}]
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) is not installed")
    kv.validate(manifests(_ctx(store, study))[0], kv.latest_version(), strict=True)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_the_deploy_kit_overrides_an_env_knob_like_a_flag(tmp_path):
    store, study = _store(tmp_path)
    kit = write_folder_atomic(tmp_path / "kit", kit_files(_ctx(store, study)))

    def dry(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(kit / "deploy.sh")], env={"PATH": os.environ["PATH"], "DRY_RUN": "1", **env},
                              capture_output=True, text=True, timeout=30)

    run = dry()
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[:3] == ["VLLM_CPU_KVCACHE_SPACE=2", "vllm", "serve"]
    run = dry(VLLM_CPU_KVCACHE_SPACE="4", MAX_NUM_SEQS="8")
    lines = run.stdout.splitlines()
    assert lines[0] == "VLLM_CPU_KVCACHE_SPACE=4" and lines[lines.index("--max-num-seqs") + 1] == "8"
    marker = tmp_path / "pwned"
    run = dry(VLLM_CPU_KVCACHE_SPACE=f"4; touch {marker}")
    assert run.returncode == 2 and run.stdout == "" and "VLLM_CPU_KVCACHE_SPACE=" in run.stderr
    assert not marker.exists()
    assert "`VLLM_CPU_KVCACHE_SPACE` (environment, set by an env knob): `2`" in (kit / "README.md").read_text()
    assert "#   export VLLM_CPU_KVCACHE_SPACE=2" in (kit / "config.yaml").read_text()


def test_show_and_diff_name_the_env_knobs(tmp_path, capsys):
    store, study = _store(tmp_path)
    assert main(["show", "--storage", store.url]) == 0
    out = capsys.readouterr().out
    assert "trial 1: env VLLM_CPU_KVCACHE_SPACE=2" in out and "with VLLM_CPU_KVCACHE_SPACE=2" in out
    assert main(["show", "--storage", store.url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["trials"]
    assert rows[1]["env"] == ENV and rows[0]["env"] == {}
    trials = store.trials(study.id)
    flags = compare(study, trials[0], trials[1], {})["flags"]
    row = next(f for f in flags if f.get("env") == "VLLM_CPU_KVCACHE_SPACE")
    assert (row["a"], row["b"], row["differs"]) == (None, "2", True)
    assert main(["diff", "--storage", store.url, "baseline", "1"]) == 0
    assert "(unset)" in capsys.readouterr().out


def test_speculative_figures_carry_their_acceptance_and_the_random_weight_label(tmp_path, capsys):
    store, study = _store(tmp_path, speculative=True)
    assert main(["show", "--storage", store.url]) == 0
    out = capsys.readouterr().out
    assert "SPECULATIVE DECODING measured on random weights and synthetic prompts" in out
    assert "speculative decoding: 41.2 % of draft tokens accepted (1.24 per draft)" in out
    for fmt in ("vllm-yaml", "command", "docker"):
        assert "SPECULATIVE DECODING measured on random weights" in _export(store, fmt, tmp_path / f"x.{fmt}")
    doc = json.loads(_export(store, "json", tmp_path / "x.json"))
    assert any("random weights" in line for line in doc["labels"])
    kit = kit_files(_ctx(store, study))
    assert "SPECULATIVE DECODING measured on random weights" in kit["README.md"][0]
    assert "SPECULATIVE DECODING measured on random weights" in kit["deploy.sh"][0]
    html = render_report(store, study)
    assert "SPECULATIVE DECODING measured on random weights and synthetic prompts" in html
    assert "41.2 % of draft tokens accepted" in html
