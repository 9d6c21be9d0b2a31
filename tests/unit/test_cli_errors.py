"""Bad input: one line on stderr, exit code 2, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main

REPO = Path(__file__).resolve().parents[2]


def _run(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


@pytest.fixture()
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


def _spec(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def _no_db(tmp_path):
    return not list(tmp_path.rglob("*.db"))


@pytest.mark.parametrize("argv_tail,needle", [
    (["--slo", "latency=1s"], "unknown metric 'latency'"),
    (["--slo", "ttft:p99<=fast"], "malformed"),
    (["--n-trials", "0"], "--n-trials"),
    (["--gpus", "a,b"], "--gpus"),
    (["--timeout", "soon"], "timeout"),
])
def test_bad_flags(tmp_path, capsys, monkeypatch, model_dir, argv_tail, needle):
    monkeypatch.chdir(tmp_path)
    code, err = _run(capsys, ["run", "--model", str(model_dir), "--storage", f"sqlite:///{tmp_path}/x.db",
                              "--engine-cmd", sys.executable, *argv_tail])
    assert code == 2 and needle in err and err.count("\n") == 1
    assert _no_db(tmp_path)


def test_malformed_yaml(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = _spec(tmp_path, "name: x\nmodel: [unclosed\n")
    code, err = _run(capsys, ["run", "--study", str(p)])
    assert code == 2 and "malformed YAML" in err and err.count("\n") == 1
    assert _no_db(tmp_path)


def test_unknown_spec_key(tmp_path, capsys, monkeypatch, model_dir):
    monkeypatch.chdir(tmp_path)
    p = _spec(tmp_path, f"model: {model_dir}\nslo: ttft=1s\nbogus_key: 1\n")
    code, err = _run(capsys, ["run", "--study", str(p)])
    assert code == 2 and "bogus_key: unknown key" in err


def test_bad_range_in_inline_space(tmp_path, capsys, monkeypatch, model_dir):
    monkeypatch.chdir(tmp_path)
    p = _spec(tmp_path, f"model: {model_dir}\nengine: {{command: [{sys.executable}]}}\n"
                        "search_space: {params: {max_num_seqs: {type: int, low: 64, high: 8}}}\n")
    code, err = _run(capsys, ["run", "--study", str(p)])
    assert code == 2 and "above high" in err
    assert _no_db(tmp_path)


def test_missing_model_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run(capsys, ["run", "--model", "./no/such/model", "--storage", f"sqlite:///{tmp_path}/x.db"])
    assert code == 2 and "neither a local model directory nor a hub id" in err
    assert _no_db(tmp_path)


def test_engine_command_not_found(tmp_path, capsys, monkeypatch, model_dir):
    monkeypatch.chdir(tmp_path)
    code, err = _run(capsys, ["run", "--model", str(model_dir), "--engine-cmd", "no-such-vllm-binary serve",
                              "--storage", f"sqlite:///{tmp_path}/x.db"])
    assert code == 2 and "engine command not found: 'no-such-vllm-binary'" in err
    assert _no_db(tmp_path)


def test_run_with_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run(capsys, ["run", "--slo", "ttft=1s"])
    assert code == 2 and "nothing to tune" in err and err.count("\n") == 1
    assert _no_db(tmp_path)


def test_show_and_export_on_missing_db(tmp_path, capsys):
    code, err = _run(capsys, ["show", "--storage", f"sqlite:///{tmp_path}/none.db"])
    assert code == 2 and "no such database file" in err
    code, err = _run(capsys, ["export", "--storage", f"sqlite:///{tmp_path}/none.db", "--format", "json", "-o", "-"])
    assert code == 2
    assert _no_db(tmp_path)


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["export", "--storage", "sqlite:///x.db", "--format", "toml", "-o", "x"])
    assert e.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_python_dash_m_is_the_same_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "autotune", "run", "--slo", "nope=1s", "--model", "x/y"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("autotune: error:") and out.stderr.count("\n") == 1


def test_init_writes_a_spec_that_validates(tmp_path, capsys, monkeypatch):
    from autotune.spec import build_spec, load_spec_file
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    raw = load_spec_file(tmp_path / "autotune.yaml")
    spec = build_spec(raw, "autotune.yaml")
    assert spec.objectives == ["capacity_tps", "p50_tpot_ms"] and spec.budget.n_trials == 30
    code, err = _run(capsys, ["init"])
    assert code == 2 and "exists" in err


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    """`autotune show ... | head`: the pipe's reader is gone before the output is written (its end is
    closed before the command starts, so the first write fails every time): exit 141, nothing on stderr."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([sys.executable, "-m", "autotune", "init", "a.yaml"], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (141, "") and (tmp_path / "a.yaml").is_file()
