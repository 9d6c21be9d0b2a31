"""Compute a scenario's landscape once with the in-process twin and cache it (gzip JSON).

For every point of the scenario's discretization: how it starts (known constraint, the memory model's
verdict; a co-tenant's free-memory refusal is applied by run.py on the exact value), and where it
starts, its closed-loop curve (concurrency ->
output tok/s, p99 TTFT, p50 TPOT; 20 requests at one stream, `requests_per_step` above, first wave
measured, as the real capacity search) probed upward and bisected to the SLO crossing. The highest
concurrency meeting the SLO is the point's true capacity; the benchmark's simulated capacity searches
interpolate the stored curve. A second, perturbed twin (the errors benchmarks/sim_calibration.md
measured) gives the capacity the warm start ranks with.

    .venv/bin/python benchmarks/search/landscape.py [SCENARIO ...]
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.errors import UserError  # noqa: E402
from autotune.perfmodel import plan  # noqa: E402
from autotune.perfmodel import roofline  # noqa: E402
from autotune.sim.capacity import capacity_curve  # noqa: E402
from autotune.slo import SLO  # noqa: E402
from autotune.space import SearchSpace  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenarios import SCENARIOS, Scenario  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = HERE / "landscapes"
PREFILL_FAST = 1.25        # the twin's prefill is ~20 % fast (time x 0.8): MFU x 1.25
MOE_LOW = (0.57, 0.65)     # MoE rows 35-43 % low: bandwidth efficiency scaled into this range, per layout


def cache_path(name: str) -> Path:
    return CACHE / f"{name}.json.gz"


@contextlib.contextmanager
def perturbed(scenario: Scenario, params: dict[str, Any]) -> Iterator[None]:
    """The twin with its measured errors, relative to the landscape taken as the truth."""
    saved = (roofline.MFU, roofline.FP8_MFU, roofline.BW_EFFICIENCY)
    roofline.MFU *= PREFILL_FAST
    roofline.FP8_MFU *= PREFILL_FAST
    if scenario.moe:
        rng = random.Random(str(params.get("parallel_layout")))
        roofline.BW_EFFICIENCY *= rng.uniform(*MOE_LOW)
    try:
        yield
    finally:
        roofline.MFU, roofline.FP8_MFU, roofline.BW_EFFICIENCY = saved


def evaluate(scenario: Scenario, space: SearchSpace, params: dict[str, Any], slo: SLO) -> dict[str, Any]:
    flags = [*scenario.fixed_flags, *space.render(params)]
    bad = space.violations(params, list(scenario.fixed_flags), scenario.num_gpus)
    if bad:
        return {"start": "constraint", "detail": "; ".join(bad)}
    try:
        p = plan(scenario.model, flags, scenario.gpu, scenario.num_gpus)
    except UserError as e:
        return {"start": "bad_flag", "detail": str(e)}
    b = p.budget
    if not b.fits:
        return {"start": b.cause or "startup_oom", "detail": b.reason.splitlines()[0] if b.reason else ""}
    out: dict[str, Any] = {"start": "ok", "kv_tokens": b.kv_cache_tokens,
                           "curve": capacity_curve(p, slo, scenario.input_len, scenario.output_len,
                                                          scenario.requests_per_step)}
    with perturbed(scenario, params):
        tw = plan(scenario.model, flags, scenario.gpu, scenario.num_gpus)
        out["twin_curve"] = capacity_curve(tw, slo, scenario.input_len, scenario.output_len,
                                           scenario.requests_per_step)
    return out


def compute(scenario: Scenario) -> dict[str, Any]:
    space = SearchSpace.from_mapping(scenario.space, scenario.name)
    slo = SLO.parse(scenario.slo)
    memo: dict[str, dict[str, Any]] = {}
    points = []
    t0 = time.time()
    for i, params in enumerate(scenario.points()):
        # Random prompts never share a block, so prefix caching cannot change the twin's result.
        key = json.dumps({k: v for k, v in params.items() if k != "enable_prefix_caching"}, sort_keys=True)
        if key not in memo:
            memo[key] = evaluate(scenario, space, params, slo)
        points.append({"params": params, **memo[key]})
        if i % 25 == 0:
            print(f"{scenario.name}: {i}/{len(scenario.points())} points, {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return {"scenario": scenario.name, "simulated": True, "grid": {k: list(v) for k, v in scenario.grid.items()},
            "points": points, "seconds": round(time.time() - t0, 1), "machine": f"{os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def load(name: str) -> dict[str, Any]:
    with gzip.open(cache_path(name), "rt") as f:
        return json.load(f)


def main(names: list[str]) -> None:
    CACHE.mkdir(exist_ok=True)
    for name in names or list(SCENARIOS):
        doc = compute(SCENARIOS[name])
        tmp = cache_path(name).with_suffix(".tmp")
        with gzip.open(tmp, "wt") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, cache_path(name))
        print(f"{name}: {len(doc['points'])} points in {doc['seconds']} s -> {cache_path(name)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
