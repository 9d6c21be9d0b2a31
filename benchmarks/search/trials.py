"""One simulated trial on a cached landscape (SIMULATED: the twin's numbers stand in for a GPU).

A candidate goes through what a real trial goes through: the known constraints, the memory model's
free check, the co-tenant's free-memory refusal (vLLM's own line, so failure learning can read it),
then a capacity search that takes autotune's own steps (`autotune.bench.step_choice`: `step_plan`
and `StepSearch`, as `find_capacity` does, a step cut short bisected and a wide bracket refined) on the
landscape's curve, interpolated between its stored steps and measured with 5 % noise, each met step's
evidence (the SLO terms, throughput, the candidate's max-num-seqs and the twin's KV-cache size) bounding
the next one's growth (`bench/step_bounds.py`; `evidence=False`: the search before), with the optional
early-stopping check asked before every further step exactly as `find_capacity` asks it. Each trial
carries its GPU seconds from a cost model fitted to the H200 runs (cost.py).
"""

from __future__ import annotations

import bisect
import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from autotune import causes
from autotune.bench.step_choice import BELOW_HINT, DESCENT, MARGIN_CAP, StepSearch, step_plan
from autotune.bench.step_bounds import ServerLimits, StepEvidence
from autotune.perfmodel import get_gpu
from autotune.sim.capacity import at_capacity
from autotune.slo import SLO
from autotune.space import SearchSpace
from autotune.tuner.earlystop import StepView

NOISE = 0.05            # relative spread of one measurement (two runs of one config on the H200: 5.3 %)
ABORT_MARGIN = 0.5      # a step whose p99 TTFT is 1.5x the limit is cut short (bench/abort.py, roughly)
MAX_STEPS = 6           # the spec's default load.max_steps (load.refine_steps: step_plan's default)


@dataclass
class Trial:
    params: dict[str, Any]
    state: str                      # ok | failed | stopped
    cause: str | None = None
    detail: str = ""
    values: dict[str, float] = field(default_factory=dict)   # measured (noisy), or the bound when stopped
    true_tps: float = 0.0           # the landscape's capacity_tps of this config (0 when it cannot run)
    full_steps: int = 0
    aborted_steps: int = 0
    launched: bool = False
    startup_failed: bool = False
    load_s_extra: float = 0.0       # load time outside the capacity-search model (auto_tune.sh's crawl)
    probed: bool = True             # the search began with the one-stream probe (cost.py charges it apart)
    bracket: tuple[float | None, float | None] = (None, None)   # highest met, lowest broken load
    loads: list[tuple[float, bool]] = field(default_factory=list)  # the search's steps: (load, met)

    @property
    def broken_steps(self) -> int:
        return sum(1 for _, met in self.loads if not met)


class Landscape:
    def __init__(self, doc: Mapping[str, Any], scenario: Any, slo: str | None = None):
        """`slo` replaces the scenario's (the stored curves hold p99 TTFT and p50 TPOT at every load;
        `true_tps` and `best_tps` keep reading the scenario's own SLO from the stored verdicts)."""
        self.scenario = scenario
        self.space = SearchSpace.from_mapping(scenario.space, scenario.name)
        self.slo = SLO.parse(slo or scenario.slo)
        self.limit = self.slo.terms[0].limit_ms
        self.grid = {k: list(v) for k, v in doc["grid"].items()}
        self.points = {self.key(p["params"]): p for p in doc["points"]}
        self.gpu_gib = get_gpu(scenario.gpu).memory_gib

    # -- lookup ------------------------------------------------------------------------------------
    @staticmethod
    def key(params: Mapping[str, Any]) -> str:
        return json.dumps(dict(params), sort_keys=True)

    def snap(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The discretization: each value to its nearest grid value (log distance on log ranges)."""
        base = self.space.baseline_params()
        out: dict[str, Any] = {}
        for name, values in self.grid.items():
            v = params.get(name, base.get(name))
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                out[name] = v
                continue
            spec = self.space.params.get(name)
            dist = (lambda a: abs(math.log(a) - math.log(v))) if spec is not None and spec.log else (lambda a: abs(a - v))
            out[name] = min(values, key=dist)
        return out

    def point(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return self.points[self.key(self.snap(params))]

    def true_tps(self, params: Mapping[str, Any]) -> float:
        p = self.point(params)
        if p["start"] != "ok" or self.cotenant_refuses(params):
            return 0.0
        best = at_capacity(p["curve"])
        return float(best["tps"]) if best else 0.0

    def best_tps(self) -> float:
        """The landscape's best: the highest true capacity_tps of any grid point this host can start."""
        return max(self.true_tps(p["params"]) for p in self.points.values())

    def twin_predict(self, params: Mapping[str, Any]) -> dict[str, float] | None:
        """The perturbed twin (the warm start's view): its own capacity at the same point."""
        p = self.point(params)
        if p["start"] != "ok":
            return None
        best = at_capacity(p["twin_curve"])
        if best is None:
            return {"capacity_tps": 0.0}
        return {"capacity_tps": float(best["tps"]), "p50_tpot_ms": float(best["tpot50"]), "capacity": float(best["c"])}

    def gmu(self, params: Mapping[str, Any]) -> float:
        return float(params.get("gpu_memory_utilization", 0.92))

    def cotenant_refuses(self, params: Mapping[str, Any]) -> bool:
        held = self.scenario.held_gib
        return bool(held) and self.gmu(params) * self.gpu_gib > self.gpu_gib - held

    # -- measuring ---------------------------------------------------------------------------------
    def at_load(self, curve: list[dict[str, Any]], c: float) -> tuple[float, float, float, bool]:
        """(tps, p99 TTFT, p50 TPOT, runtime OOM) at load c, linear between the stored steps."""
        cs = [p["c"] for p in curve]
        oom = any(p["oom"] and c >= p["c"] for p in curve)
        i = bisect.bisect_left(cs, c)
        if i < len(cs) and cs[i] == c:
            p = curve[i]
            return p["tps"], p["ttft99"], p["tpot50"], oom
        if i == 0:
            p = curve[0]
            return p["tps"], p["ttft99"], p["tpot50"], oom
        a, b = curve[i - 1], curve[min(i, len(cs) - 1)]
        if i >= len(cs):                     # beyond the last step: latency keeps its last slope
            a, b = curve[-2] if len(curve) > 1 else curve[-1], curve[-1]
        span = (b["c"] - a["c"]) or 1.0
        f = (c - a["c"]) / span
        tps = a["tps"] + f * (b["tps"] - a["tps"]) if i < len(cs) else b["tps"]
        return tps, a["ttft99"] + f * (b["ttft99"] - a["ttft99"]), a["tpot50"] + f * (b["tpot50"] - a["tpot50"]), oom

    def terms(self, ttft: float, tpot: float) -> dict[str, tuple[str, float, float]]:
        """The SLO's terms at one step, from the two statistics a curve stores (p99 TTFT, p50 TPOT)."""
        have = {("ttft", 99.0): ttft, ("tpot", 50.0): tpot}
        out = {}
        for t in self.slo.terms:
            if (t.metric, t.percentile) not in have:
                raise ValueError(f"the landscapes hold p99 TTFT and p50 TPOT only, not {t.key}")
            out[t.key] = (t.metric, have[(t.metric, t.percentile)], t.limit_ms)
        return out

    def limits(self, params: Mapping[str, Any]) -> ServerLimits:
        """What a real trial's search is told: max-num-seqs from the flags, the KV-cache size the (twin's)
        server logs."""
        flags = [*self.scenario.fixed_flags, *self.space.render({**self.space.baseline_params(), **params})]
        return ServerLimits.from_flags(flags, self.point(params).get("kv_tokens"))

    def run(self, params: Mapping[str, Any], rng: random.Random, should_stop: Any = None,
            hint: tuple[float, float | None] | None = None, evidence: bool = True,
            below_hint: float | None = BELOW_HINT, descent: float | None = DESCENT) -> Trial:
        """One trial of `params` (the candidate's searched values; baseline defaults fill the rest).
        `hint`: `study_hint` of the study so far; the search starts there as `find_capacity` does (no
        probe; the probe after a first step that breaks). `evidence`: the search bounds its growth by
        what each met step measured and the server's limits (bench/step_bounds.py), as `find_capacity`
        does; False is the search before that (the benchmark's "before" rows). `below_hint`: step_plan's
        step below a broken hinted start (None: the probe at once, the search before that change);
        `descent`: its further steps down while those break too (None: the probe after the first)."""
        params = dict(params)
        bad = self.space.violations(params, list(self.scenario.fixed_flags), self.scenario.num_gpus)
        if bad:
            return Trial(params, "failed", causes.CONSTRAINT, "; ".join(bad))
        p = self.point(params)
        if p["start"] != "ok":
            return Trial(params, "failed", causes.PREDICTED_OOM, p.get("detail", ""))
        if self.cotenant_refuses(params):
            total, free = self.gpu_gib, self.gpu_gib - self.scenario.held_gib
            g = self.gmu(params)
            return Trial(params, "failed", causes.STARTUP_OOM, launched=True, startup_failed=True, detail=(
                f"Free memory on device cuda:0 ({free:.2f}/{total:.1f} GiB) on startup is less than desired GPU "
                f"memory utilization ({g:g}, {g * total:.2f} GiB). Decrease GPU memory utilization or reduce "
                f"GPU memory used by other processes."))
        trial = Trial(params, "ok", launched=True, true_tps=self.true_tps(params))
        search = StepSearch(True, 1024.0, 0.03, hinted=hint is not None, expect_broken=hint[1] if hint else None,
                            limits=self.limits(params) if evidence else None)
        per_request = self.scenario.input_len + self.scenario.output_len
        views: list[StepView] = []
        measured: dict[float, tuple[float, float]] = {}
        trial.probed = hint is None

        def step(load: float) -> bool:
            """Measure one load; False when the simulated engine died (the trial failed)."""
            tps, ttft, tpot, oom = self.at_load(p["curve"], load)
            if oom:
                trial.state, trial.cause, trial.detail = "failed", causes.RUNTIME_OOM, "simulated runtime OOM"
                trial.full_steps += 1
                return False
            tps, ttft, tpot = (x * (1 + rng.gauss(0, NOISE)) for x in (tps, ttft, tpot))
            terms = self.terms(ttft, tpot)
            margin = min(MARGIN_CAP, max(v / limit - 1 for _, v, limit in terms.values()))
            aborted = margin > ABORT_MARGIN
            met = margin <= 0
            ev = StepEvidence(terms, tps / self.scenario.output_len, load, per_request) if evidence else None
            search.add(load, margin, met, cut_short=aborted, evidence=ev)
            trial.loads.append((load, met))
            views.append(StepView(load, met, None if aborted else tps, tpot, ttft, aborted))
            measured[load] = (tps, tpot)
            if aborted:
                trial.aborted_steps += 1
            else:
                trial.full_steps += 1
            return True

        def stop() -> bool:                                 # as find_capacity asks it
            if should_stop is not None and should_stop(views):
                trial.state, trial.cause = "stopped", causes.EARLY_STOPPED
            return trial.state == "stopped"

        # the steps find_capacity takes (step_plan), each measured on the curve
        plan = step_plan(search, float(int(hint[0])) if hint is not None else 1.0, probe=hint is None,
                         max_steps=MAX_STEPS, should_stop=stop, below_hint=below_hint,
                         descent=descent)
        load, probe = next(plan)
        while True:
            trial.probed = trial.probed or probe
            if not step(load):
                return trial
            try:
                load, probe = plan.send(views[-1].met)
            except StopIteration:
                break
        if trial.state == "stopped":
            return trial
        lo, hi = search.bracket()
        trial.bracket = (lo[0] if lo else None, hi[0] if hi else None)
        if lo is None:
            trial.values = {"capacity_tps": 0.0, "p50_tpot_ms": measured[1.0][1]}
        else:
            tps, tpot = measured[lo[0]]
            trial.values = {"capacity_tps": tps, "p50_tpot_ms": tpot}
        return trial
