"""The study's bytecode cache (engine/cache.py): where the environment turns bytecode writing off, a
server's Python writes its bytecode under the study's cache folder once and later starts read it; where
writing is on, nothing is added. Real subprocesses of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autotune.engine.cache import compile_cache_env


def _import(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", "import cached_mod"], check=True, env=env, timeout=60)


def test_bytecode_goes_to_the_study_cache_where_the_environment_turned_it_off(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "cached_mod.py").write_text("VALUE = 1\n")
    base = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(src)}
    base.pop("PYTHONPYCACHEPREFIX", None)
    _import(base)
    assert not list(tmp_path.rglob("*.pyc"))                   # as the device image runs: never written
    env = compile_cache_env(tmp_path / "cache", environ=base)
    assert env["PYTHONDONTWRITEBYTECODE"] == "" and env["PYTHONPYCACHEPREFIX"] == str((tmp_path / "cache" / "pycache").resolve())
    _import({**base, **env})
    written = list((tmp_path / "cache" / "pycache").rglob("cached_mod*.pyc"))
    assert len(written) == 1 and not (src / "__pycache__").exists()   # in the study's folder, not beside the source
    stamp = written[0].stat().st_mtime_ns
    _import({**base, **env})
    assert written[0].stat().st_mtime_ns == stamp              # the second start read it, did not rewrite it


def test_nothing_is_added_where_bytecode_writing_is_on(tmp_path: Path) -> None:
    env = compile_cache_env(tmp_path / "cache", environ={})
    assert set(env) == {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    mine = compile_cache_env(tmp_path / "cache", environ={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/x"})
    assert "PYTHONPYCACHEPREFIX" not in mine and "PYTHONDONTWRITEBYTECODE" not in mine   # the user's own prefix stands
