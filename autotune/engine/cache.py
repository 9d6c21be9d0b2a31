"""vLLM's compilation caches on disk, shared by the trials of one study.

A vLLM start spends tens of seconds compiling (torch.compile, Inductor, Triton: 18-59 s of 81-151 s on
the H200, benchmarks/gpu); a restart that finds its caches skips most of it (104 s -> 36 s for the same
config, REFERENCE.md §2b). Pointing every trial of a study at one cache folder keeps what one trial
compiled for the next: vLLM's own torch.compile artifacts are keyed by a hash of the config, so a new
config misses them, but Inductor's FX-graph and Triton's kernel caches are keyed by the graph and kernel
source, which candidates differing only in scheduler settings may share (how much a new config reuses
on a GPU is not measured yet: issue 12, item 6). All three write with a temporary file and an atomic rename, so
trials running at the same time can share them. Nothing here changes what is measured: the same
kernels run; only the time to build them moves.

Python's own bytecode is a fourth cache. Where the environment turns bytecode writing off
(PYTHONDONTWRITEBYTECODE, common in container images; the H200 device image sets it and installs vLLM
without .pyc files), every start compiled vLLM's, torch's and transformers' modules from source, twice
(the API server and the engine core: 38-44 s of "process and imports" in a 65-77 s start on the H200).
There the trials get PYTHONPYCACHEPREFIX under the study's cache folder with bytecode writing back on,
so the first start writes the bytecode there (never into site-packages) and the later ones read it
(Python writes it with an atomic rename too). Where bytecode writing is on, nothing is changed: the
installed __pycache__ folders already serve every start.

A container engine does not see these variables unless the command passes them in (`-e`, `-v`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def compile_cache_env(root: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launch environment that puts the caches under `root` (created here); `environ` (default: this
    process's) says whether bytecode writing is off, which adds the bytecode cache."""
    root = Path(root).resolve()
    dirs = {"VLLM_CACHE_ROOT": root / "vllm", "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
            "TRITON_CACHE_DIR": root / "triton"}
    environ = os.environ if environ is None else environ
    if environ.get("PYTHONDONTWRITEBYTECODE") and not environ.get("PYTHONPYCACHEPREFIX"):
        dirs["PYTHONPYCACHEPREFIX"] = root / "pycache"
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: str(v) for k, v in dirs.items()}
    if "PYTHONPYCACHEPREFIX" in env:
        env["PYTHONDONTWRITEBYTECODE"] = ""     # empty: writing on (Python reads "set" as non-empty)
    return env
