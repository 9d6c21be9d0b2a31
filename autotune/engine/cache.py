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

A container engine does not see these variables unless the command passes them in (`-e`, `-v`).
"""

from __future__ import annotations

from pathlib import Path

CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def compile_cache_env(root: Path) -> dict[str, str]:
    """The launch environment that puts the three caches under `root` (created here)."""
    root = Path(root).resolve()
    dirs = {"VLLM_CACHE_ROOT": root / "vllm", "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
            "TRITON_CACHE_DIR": root / "triton"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {k: str(v) for k, v in dirs.items()}
