"""Secrets never reach the database, autotune's logs, `show` or an export (docs/RELIABILITY.md).

A real run (the stand-in server as the engine, a real subprocess; it echoes its arguments and HF_TOKEN
into its log as a careless server would) with an HF token in engine.env and an `--api-key` among the
engine flags; then every output is searched for both values: the SQLite file's bytes, every file under
the log folder, `show` and `show --json`, and every export format.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from autotune.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fault_matrix import rows, study  # noqa: E402

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)

HF = "hf_PLANTEDtokenABCDEFGHIJKLMNOPQRSTUV"
KEY = "sk-planted-api-key-0123456789"


def rows_of(tmp_path: Path) -> list[tuple]:
    return [(state, json.loads(metrics)["completed"]) for state, metrics in
            rows(tmp_path, "select state, metrics from autotune_trials")]


def test_planted_secrets_are_in_no_output(tmp_path: Path, demo_model_dir: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "env-planted-secret-987654")   # autotune's own environment
    spec = study(tmp_path, demo_model_dir, "ok", env={"HF_TOKEN": HF}, extra=["--api-key", KEY])
    assert main(["run", "--study", str(spec), "--n-trials", "1", "--no-progress"]) == 0
    # the load client sent the key: the server (which answers 401 without it) was really measured
    assert rows_of(tmp_path) == [("ok", 16)]
    log = next((tmp_path / "faults-logs").glob("trial-*.log"))
    text = log.read_text()
    assert "non-default args" in text and "--api-key" in text          # the server did echo them ...
    outputs = {"db": (tmp_path / "faults.db").read_bytes().decode("latin-1")}
    for path in (tmp_path / "faults-logs").rglob("*"):
        outputs[str(path)] = path.read_bytes().decode("latin-1")
    storage = f"sqlite:///{tmp_path}/faults.db"
    capsys.readouterr()
    for args in (["show", "--storage", storage], ["show", "--storage", storage, "--json"]):
        assert main(args) == 0
        outputs[" ".join(args)] = capsys.readouterr().out
    for fmt in ("vllm-yaml", "command", "json"):
        out = tmp_path / f"best.{fmt}"
        assert main(["export", "--storage", storage, "--format", fmt, "--trial", "0", "-o", str(out)]) == 0
        outputs[fmt] = out.read_text()
    outputs["stdout/stderr"] = "".join(capsys.readouterr())
    for name, body in outputs.items():
        for secret in (HF, KEY, "env-planted-secret-987654"):
            assert secret not in body, f"{secret} leaked into {name}"
    assert "***" in text                                                   # ... and autotune's copy is redacted
    assert "--api-key" not in outputs["command"].splitlines()[-1] and "api-key" not in yaml.safe_load(outputs["vllm-yaml"])
    assert "secrets are never stored: --api-key" in outputs["vllm-yaml"]
