"""The `sim` engine: the labelled twin (`autotune sim-serve`) launched exactly as vLLM is.

Same process hygiene and readiness/failure handling as `VLLMServer` (the twin prints vLLM's log
lines, so the same classifier reads it); the only differences are the command line, the flag check
(sim-serve's own parser instead of `vllm --help`), and `StartupInfo.simulated = True`.

    >>> engine = SimEngine("H100", 1, time_scale=50)                               # doctest: +SKIP
    >>> server = engine.launch(LaunchRequest(model="glm-4.6v-9b", flags=["--max-num-seqs", "64"],
    ...                                      port=find_free_port(), log_path=Path("trial-0.log")))
    >>> server.wait_ready().kv_cache_tokens; server.stop()
"""

from __future__ import annotations

import os
import sys
import time
from typing import Sequence

from autotune.engine.base import Engine, LaunchRequest, StartupInfo
from autotune.engine.process import spawn, wait_port_free
from autotune.engine.vllm import VLLMServer
from autotune.errors import UserError
from autotune.perfmodel.config import known_flags
from autotune.perfmodel.gpus import get_gpu
from autotune.sim.startup import VERSION


class SimServer(VLLMServer):
    def wait_ready(self) -> StartupInfo:
        info = super().wait_ready()
        info.simulated = True
        info.phases = None   # the twin logs its model's startup durations but sleeps them time-scaled: no split
        info.engine_version = info.engine_version or VERSION
        return info


class SimEngine(Engine):
    name = "sim"

    def __init__(self, gpu: str, num_gpus: int, time_scale: float = 1.0, seed: int = 0):
        get_gpu(gpu)  # unknown GPU: one-line UserError now, not a failed trial later
        if num_gpus < 1 or time_scale <= 0:
            raise UserError(f"sim engine needs num_gpus >= 1 and time_scale > 0 (got {num_gpus}, {time_scale})")
        self.gpu, self.num_gpus, self.time_scale, self.seed = gpu, num_gpus, time_scale, seed
        self._known = known_flags()

    def argv(self, model: str, port: int, flags: Sequence[str] = ()) -> list[str]:
        return [sys.executable, "-m", "autotune", "sim-serve", "--gpu", self.gpu, "--num-gpus", str(self.num_gpus),
                "--model-profile", model, "--host", "127.0.0.1", "--port", str(port),
                "--time-scale", f"{self.time_scale:g}", "--seed", str(self.seed), "--", *[str(f) for f in flags]]

    def launch(self, request: LaunchRequest) -> SimServer:
        argv = self.argv(request.model, request.port, request.flags)
        offset = request.log_path.stat().st_size if request.log_path.exists() else 0
        started = time.monotonic()
        popen = spawn(argv, request.log_path, env={**os.environ, **request.env, "PYTHONUNBUFFERED": "1"},
                      cores=request.cores)
        return SimServer(popen, argv, request, offset, started)

    def unknown_flags(self, flags: Sequence[str]) -> list[str]:
        out: list[str] = []
        for flag in flags:
            flag = str(flag)
            if not flag.startswith("--") or flag == "--":
                continue
            name = flag.split("=", 1)[0]
            if name not in self._known and name not in out:
                out.append(name)
        return out

    def version(self) -> str | None:
        return VERSION

    def release_wait(self, port: int, gpus: Sequence[int], timeout_s: float = 60.0) -> None:
        wait_port_free(port, timeout_s)
