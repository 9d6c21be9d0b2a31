"""Whether the server compiled a kernel while one load step ran, read from its log.

A kernel JIT-compiled under load stalls the server for seconds (seen on two H200s: `fused_moe_kernel`
during a MoE step, benchmarks/gpu/round2/RESULTS.md); that step measured the compile, not the
configuration. The window of a step is the log's growth between `begin()` and `disturbed()`: byte
offsets, not timestamps, because the log only grows while the server runs (autotune appends its header
before the launch and redacts it only after the server stopped), and vLLM's timestamps have one-second
resolution and no year.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from autotune.engine.logparse import jit_compiles


class JitWatch:
    """A capacity search's step watch (bench/capacity.StepWatch) over a server's log, and `more` logs of
    the same candidate (a PD deployment's instances, engine/deployment.py: any of them may compile)."""

    def __init__(self, log_path: str | Path, more: Sequence[str | Path] = ()) -> None:
        self.paths = [Path(log_path), *(Path(p) for p in more)]
        self.offsets = [self._size(p) for p in self.paths]

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return os.path.getsize(path)
        except OSError:
            return 0

    def begin(self) -> None:
        """Mark the start of a step: what the logs hold so far is not the step's."""
        self.offsets = [self._size(p) for p in self.paths]

    def disturbed(self) -> str | None:
        """Why the step since `begin()` did not measure the configuration alone, or None. The caller
        lets the server finish the step first (a cut-short step's requests still run, and vLLM writes
        its warning after the compile, not before)."""
        text = ""
        for path, offset in zip(self.paths, self.offsets):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    text += f.read().decode("utf-8", errors="replace") + "\n"
            except OSError:
                continue
        names = list(dict.fromkeys(jit_compiles(text)))
        if not names:
            return None
        return "the server JIT-compiled " + ", ".join(names) + " during the step"
