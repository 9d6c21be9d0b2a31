"""`cpu`: the server's whole process tree through psutil, for the CPU build and GPU-less hosts.

vLLM's CPU build runs an API server, an engine core and workers as separate processes that appear
after start, so the tree is re-walked every sample and each process object is kept between samples
(psutil measures a process's CPU percent between two calls on the same object). RSS is summed over
the tree and set against system memory, so `mem_headroom` and the headroom constraint work here too
(shared pages are counted once per process: an over-estimate, which errs on the safe side).
"""

from __future__ import annotations

from typing import Any

import psutil

from autotune.errors import UserError
from autotune.telemetry._poll import PollingSampler, Probe
from autotune.telemetry._stats import RunningStats
from autotune.telemetry.base import Sampler, TelemetrySource, TelemetrySummary, TelemetryTarget

MIB = 1024 * 1024


class CpuProbe(Probe):
    source = "cpu"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._procs: dict[int, psutil.Process] = {}
        self._root: psutil.Process | None = None
        self._measured: set[int] = set()
        self.stats = RunningStats()
        self.max_procs = 0
        self.mem_total_mib = psutil.virtual_memory().total / MIB

    def open(self) -> None:
        try:
            self._root = psutil.Process(self.pid)
        except psutil.Error as exc:
            raise UserError(f"telemetry: server process {self.pid} is not running ({exc})") from None

    def _tree(self) -> list[psutil.Process]:
        assert self._root is not None
        try:
            found = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            found = []
        alive: dict[int, psutil.Process] = {}
        for p in found:
            # Keep the object we already hold so cpu_percent measures since the last sample.
            alive[p.pid] = self._procs.get(p.pid, p)
        self._procs = alive
        return list(alive.values())

    def read(self, t: float) -> dict[str, Any] | None:
        cpu = 0.0
        rss = 0
        fresh = 0
        for p in self._tree():
            try:
                with p.oneshot():
                    pct = p.cpu_percent(None)
                    rss += p.memory_info().rss
                if p.pid not in self._measured:
                    self._measured.add(p.pid)   # the first call only sets psutil's reference point
                    fresh += 1
                else:
                    cpu += pct
            except psutil.Error:
                continue      # exited between the walk and the read
        n = len(self._procs)
        if n == 0:
            return None
        self.max_procs = max(self.max_procs, n)
        rss_mib = rss / MIB
        row: dict[str, Any] = {"t": round(t, 3), "rss_mib": round(rss_mib, 1), "procs": n}
        self.stats.add("rss_mib", rss_mib)
        if fresh < n:           # at least one process had a previous reading to measure against
            row["cpu_pct"] = round(cpu, 1)
            self.stats.add("cpu_pct", cpu)
        return row

    def summarise(self, s: TelemetrySummary) -> None:
        s.cpu_pct_mean = _r(self.stats.mean("cpu_pct"))
        s.rss_peak_mib = _r(self.stats.max("rss_mib"))
        s.peak_mem_used_mib = s.rss_peak_mib
        s.mem_total_mib = _r(self.mem_total_mib)
        s.unsupported = ["power_w", "energy_mj"]
        if self.stats.count("cpu_pct") == 0 and self.stats.count("rss_mib") == 0:
            s.note = f"server process {self.pid} could not be read"


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


class CpuSource(TelemetrySource):
    name = "cpu"

    def sampler(self, target: TelemetryTarget, hz: float = 10.0) -> Sampler:
        if target.server_pid is None:
            raise UserError("telemetry source 'cpu' needs the server's process id")
        return PollingSampler(CpuProbe(target.server_pid), target, hz=hz)
