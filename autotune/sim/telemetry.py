"""Simulated GPU telemetry and the Prometheus page, read from the scheduler's counters.

Power follows utilization and how compute-heavy the recent steps were (H200 reference: 79 W idle,
~690 W under a matmul loop at the 700 W cap, REFERENCE.md §3); memory is what vLLM preallocates
(weights, activations, graphs, KV: the whole --gpu-memory-utilization budget). Every reading says
`simulated`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from autotune.perfmodel.predict import Plan
from autotune.sim.scheduler import Scheduler, Step

WINDOW_S = 0.5   # simulated seconds the utilization is averaged over


class GpuMeter:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.recent: deque[tuple[float, float, float, float]] = deque()   # (t_end, busy, compute_share, mem_share)
        self.extra_energy_j = 0.0
        self.ready = False

    def record(self, step: Step, t_end: float) -> None:
        c = step.cost
        core = max(c.compute_s + c.memory_s, 1e-12)
        compute_share, mem_share = c.compute_s / core, c.memory_s / core
        self.recent.append((t_end, c.seconds, compute_share, mem_share))
        gpu = self.plan.gpu
        self.extra_energy_j += (self._busy_power(compute_share) - gpu.idle_w) * c.seconds
        while self.recent and self.recent[0][0] < t_end - 4 * WINDOW_S:
            self.recent.popleft()

    def _busy_power(self, compute_share: float) -> float:
        g = self.plan.gpu
        return g.idle_w + (g.tdp_w - g.idle_w) * (0.55 + 0.43 * compute_share)

    def snapshot(self, now: float) -> dict[str, Any]:
        g, b = self.plan.gpu, self.plan.budget
        busy = comp = mem = 0.0
        for t_end, dur, cs, ms in self.recent:
            if t_end >= now - WINDOW_S:
                busy += dur
                comp += dur * cs
                mem += dur * ms
        util = min(1.0, busy / WINDOW_S)
        cshare = comp / busy if busy else 0.0
        mshare = mem / busy if busy else 0.0
        power = g.idle_w + util * (self._busy_power(cshare) - g.idle_w)
        used_gib = (b.requested_gib + 0.5) if self.ready else 0.6
        energy_mj = (g.idle_w * max(now, 0.0) + self.extra_energy_j) * 1000.0
        clock = g.idle_sm_mhz if util < 0.01 else g.max_sm_mhz * (1.0 - 0.25 * cshare)
        gpus = []
        for i in range(self.plan.config.world_size):
            gpus.append({"index": i, "power_w": round(power, 1), "energy_mj": round(energy_mj, 1),
                         "util_pct": round(util * 100, 1), "mem_util_pct": round(util * mshare * 85, 1),
                         "mem_used_mib": round(min(used_gib, g.memory_gib) * 1024, 1),
                         "mem_total_mib": round(g.memory_gib * 1024, 1), "sm_clock_mhz": round(clock),
                         "temp_c": round(33 + 35 * power / g.tdp_w, 1)})
        return {"simulated": True, "time_s": round(now, 6), "gpu": g.name, "gpus": gpus}


def prometheus(sched: Scheduler, model: str, stream: dict[str, float], sim_time: float) -> str:
    """vLLM's metric names (labels model_name/engine as vLLM writes them) plus autotune_sim_*."""
    lab = f'{{engine="0",model_name="{model}"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", len(sched.running)),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", len(sched.waiting)),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", sched.kv_usage),
        ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", sched.preemptions),
        ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
         sched.prefix_queries),
        ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
         sched.prefix_hits),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", sched.prompt_tokens_total),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         sched.generation_tokens_total),
    ]
    out: list[str] = []
    for name, kind, help_, value in rows:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{lab} {float(value)}"]
    out += ["# HELP autotune_sim_info This server is the autotune simulator, not vLLM.",
            "# TYPE autotune_sim_info gauge",
            f'autotune_sim_info{{simulated="true",model_name="{model}",gpu="{sched.plan.gpu.name}"}} 1.0']
    for key, value in stream.items():
        kind = "counter" if key.endswith("_total") else "gauge"
        out += [f"# TYPE autotune_sim_{key} {kind}", f"autotune_sim_{key} {float(value)}"]
    out += ["# TYPE autotune_sim_time_seconds gauge", f"autotune_sim_time_seconds {sim_time}"]
    return "\n".join(out) + "\n"
