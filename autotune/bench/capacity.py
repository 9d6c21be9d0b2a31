"""Capacity under the SLO: the highest load at which every SLO term still holds, found in a few steps.

Which load comes next is step_choice.py's (a probe at one stream or a hinted start, extrapolation while
every step passes, bounded by what the met steps say about queueing: step_bounds.py, then regula falsi
inside the bracket); this module measures the steps. A step that clearly breaks the SLO is cut short
(abort.py). The prefix
cache is reset before each step (retried until the server has freed a cut-short step's requests) and
every step draws its own prompts, so one step's cache hits cannot flatter the next.

Steady steps: a closed-loop step counts at least `min_waves` waves (requests >= waves x concurrency)
after its first wave, which is sent under the same load but kept out of the figures (its requests leave
together and queue their prefills, so it measures the start, not the server; it is reported apart). An
open-loop step lasts at least `min_step_s` at its rate. The result carries its bracket (highest load
met, lowest broken); a bracket wider than `max_bracket` (relative to its lower end) gets up to
`refine_steps` extra steps, and one still wide is flagged `wide_bracket`.

A step during which the server JIT-compiled a kernel (a `step_watch` reads its log) measured the compile:
it is run once more (the kernel is cached by then) and the re-run is used; a re-run that compiled again
is kept and the result flagged `jit_compile`.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from typing import Any, Callable, Iterable, Protocol, Sequence

import aiohttp

from autotune.bench import measurement_flags as mflags
from autotune.bench.metrics import capacity_tps, slo_margins
from autotune.bench.replay import replay_cap_note, replay_rate, replay_requests, replay_upper
from autotune.bench.results import CapacityResult, LoadStep, Measurement, RequestRecord
from autotune.bench.runner import run_load
from autotune.bench.step_bounds import ServerLimits, StepEvidence
from autotune.bench.step_choice import (DEFAULT_MAX_BRACKET, DEFAULT_REFINE_STEPS, DEFAULT_TOLERANCE, MARGIN_CAP,
                                        StepSearch, is_wide, step_plan)
from autotune.bench.workloads import Workload
from autotune.errors import UserError
from autotune.slo import SLO

PROBE_REQUESTS = 20        # single-stream speed settles within a few requests; more only costs time
RESET_WAIT_S = 60.0        # how long a refused prefix-cache reset is retried (cancelled requests draining)
RESET_RETRY_S = 0.5
STEP_SEED_STRIDE = 1_000_003   # each step draws its own prompts: a failed reset cannot replay a step's prompts
DEFAULT_WAVES = 3          # counted closed-loop waves per step: one wave's latencies are one sample of a queue


def relative_margin(step: LoadStep, slo: SLO) -> float:
    """Worst term's measured / limit - 1 (<= 0 where met), from the step's own records. The requests an
    early abort cut off in flight count as failed: they did not finish in time, and without them an
    open-loop step cut short keeps only its first, fastest requests and its margin reads as barely broken
    (seen replaying a trace: the next load then landed next to the failing one, step after step)."""
    cut = int(step.measurement.load.get("cancelled") or 0)
    margins = slo_margins(list(step.measurement.records) + [_CUT] * cut, slo)
    limits = {t.key: t.limit_ms for t in slo.terms}
    # a class term with no request of its class in the step is not in `margins`: the others decide
    return min(MARGIN_CAP, max((margins[k] / limits[k] for k in margins), default=0.0))


_CUT = RequestRecord(start_s=0.0, ttft_ms=None, e2el_ms=None, itl_ms=[], input_tokens=0, output_tokens=0, ok=False,
                     error="cut off by an early abort")


async def reset_prefix_cache(base_url: str, wait_s: float = RESET_WAIT_S) -> bool:
    """True when the server reset its prefix cache; False on 404 (vLLM without VLLM_SERVER_DEV_MODE=1),
    any other refusal, or a reset still refused after `wait_s`, which the result records as 'cache not
    reset'. vLLM answers 200 with {"success": false} while blocks are held, which right after a step cut
    short is normal (its cancelled requests are still being freed); a reset that silently failed there
    let the next step replay cached prompts (seen on an H200: 65 % prefix hits, an inflated capacity),
    so a refused reset is retried until the server has drained."""
    deadline = time.monotonic() + wait_s
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            while True:
                async with s.post(base_url.rstrip("/") + "/reset_prefix_cache") as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        return False
                if _reset_succeeded(body):
                    return True
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(RESET_RETRY_S)
    except (aiohttp.ClientError, OSError):
        return False


def _reset_succeeded(body: bytes) -> bool:
    """vLLM returns {"success": bool}; older servers an empty 200, which is taken as done."""
    try:
        doc = json.loads(body)
    except ValueError:
        return True
    return bool(doc.get("success", True)) if isinstance(doc, dict) else True


class StepWatch(Protocol):
    """Asked around each step's run (engine/logwatch.JitWatch reads the server's log)."""

    def begin(self) -> None: ...

    def disturbed(self) -> str | None:
        """Why the run since `begin()` did not measure the configuration alone, or None."""


async def find_capacity(base_url: str, model: str, workload: Workload, slo: SLO, *, search: str = "concurrency",
                        max_steps: int = 6, requests_per_step: int = 200, warmup: int = 16, seed: int = 0,
                        tokenizer: str | None = None, start: float | None = None, upper: float | None = None,
                        on_step: Callable[[LoadStep], None] | None = None, endpoint: str = "completions",
                        tolerance: float = DEFAULT_TOLERANCE, timeout_s: float = 600,
                        min_waves: int = DEFAULT_WAVES, min_step_s: float | None = None,
                        max_bracket: float = DEFAULT_MAX_BRACKET,
                        refine_steps: int = DEFAULT_REFINE_STEPS, stall_timeout_s: float | None = None,
                        api_key: str | None = None,
                        should_stop: Callable[[list[LoadStep]], bool] | None = None,
                        step_watch: StepWatch | None = None, check: float | None = None,
                        hint: tuple[float, float | None] | None = None,
                        limits: ServerLimits | None = None) -> CapacityResult:
    """Highest concurrency (`search="concurrency"`, closed loop), request rate (`"rate"`, Poisson) or
    trace speed-up (`"time_scale"`: a trace replayed at its recorded times divided by the load) at which
    every term of `slo` holds, within `max_steps` load steps (the probe counts as one) plus up to
    `refine_steps` while the bracket is wider than `max_bracket`.
    `should_stop(steps)`, asked before each further step, ends the search early (tuner/earlystop.py).
    `step_watch` says whether a step's run was disturbed (a kernel compiled during it): it is re-run once.
    `check` is a load whose pass or fail the result must settle: when the search ends with it strictly
    inside the bracket, one more step measures it. A confirmation repeat checks its first run's highest
    met load; without it a repeat whose bracket straddles that load reports the bracket's lower end and
    reads as "below the first run" by the search's resolution alone (seen on the H200: 49 / 58 against a
    first run's 58 / 59).
    `hint` is a bracket (met, broken or None) the caller expects, e.g. the capacities the study's earlier
    trials measured: the search starts at its met end instead of the probe at one stream, and a pass there
    aims next at its broken end. On the H200 the probe and the step after it took 30 s of a trial's 77 s
    of load, measuring loads far below a capacity every trial of the study shared. A first step that
    breaks the SLO is followed by one at 3/4 of it and, when that breaks too, by the probe
    (step_choice.step_plan), so a wrong hint costs one or two steps cut short, not the answer: the result
    is still the highest met and lowest broken load the steps found.
    `limits` (the server's max-num-seqs and logged KV-cache size) and what each met step measured bound
    the next step's growth (step_bounds.py), so a long-prompt search does not leap past a knee."""
    if search not in ("concurrency", "rate", "time_scale"):
        raise UserError(f"capacity search is by 'concurrency', 'rate' or 'time_scale', not {search!r}")
    trace_rate = replay_rate(workload) if search == "time_scale" else None   # replay.py (trace replay)
    if max_steps < 2:
        raise UserError("a capacity search needs max_steps >= 2")
    if requests_per_step < 1:
        raise UserError("requests_per_step must be >= 1")
    if min_waves < 0 or refine_steps < 0 or not max_bracket > 0:
        raise UserError("min_waves and refine_steps must be >= 0 and max_bracket > 0")
    integer = search == "concurrency"
    cap_load = upper if upper is not None else (1024 if integer else math.inf)
    if hint is not None and (start is not None or trace_rate is not None or not hint[0] > (1 if integer else 0)):
        hint = None   # an explicit start wins; a trace's replay needs its probe (replay_upper); one stream is the probe
    if hint is not None:
        hint = (min(float(int(hint[0])) if integer else float(hint[0]), cap_load),
                hint[1] if hint[1] is not None and hint[1] > hint[0] else None)
    searcher = StepSearch(integer, cap_load, tolerance, hinted=hint is not None,
                          expect_broken=hint[1] if hint else None, limits=limits)
    steps: list[LoadStep] = []
    cache_reset = True
    common: dict[str, Any] = dict(slo=slo, endpoint=endpoint, tokenizer=tokenizer, timeout_s=timeout_s,
                                  abort_on_slo=True, stall_timeout_s=stall_timeout_s, api_key=api_key)

    async def measure(load: float, probe: bool, seed_i: int) -> Measurement:
        n, settle = step_requests(load, probe, integer, requests_per_step, min_waves, min_step_s)
        if probe or integer:
            m = await run_load(base_url, model, workload, concurrency=int(load), num_requests=n, settle=settle,
                               warmup=min(warmup, 4) if probe else warmup, seed=seed_i, **common)
        elif trace_rate is not None:   # trace replay: the step replays the trace `load` times as fast
            m = await run_load(base_url, model, workload, time_scale=1.0 / load, warmup=warmup, seed=seed_i,
                               num_requests=replay_requests(workload, n, warmup), **common)
        else:
            m = await run_load(base_url, model, workload, rate=load, num_requests=n, warmup=warmup, seed=seed_i,
                               **common)
        return m

    async def watched(load: float, probe: bool, seed_i: int) -> tuple[Measurement, list[str], Measurement | None]:
        """The step's run, its disturbances and the run discarded for one (see the module's docstring)."""
        disturbances: list[str] = []
        discarded: Measurement | None = None
        for attempt in range(2):
            if step_watch is not None:
                step_watch.begin()
            m = await measure(load, probe, seed_i + attempt)   # a re-run draws its own prompts
            if step_watch is None:
                break
            await reset_prefix_cache(base_url)   # waits until the step's requests (a cut-short step's too)
            why = step_watch.disturbed()          # are done, so that their compiles are in the log
            if why is None:
                break
            disturbances.append(why)
            discarded = discarded or m
        return m, disturbances, discarded

    async def step(load: float, probe: bool) -> LoadStep:
        nonlocal cache_reset
        cache_reset = await reset_prefix_cache(base_url) and cache_reset
        m, disturbances, discarded = await watched(load, probe, seed + STEP_SEED_STRIDE * len(steps))
        if probe and start is None and not integer:
            load = float(f"{m.metrics['request_throughput'] / (trace_rate or 1.0):.3g}")   # the single stream's own rate
        s = LoadStep(load=load, measurement=m, slo_met=False, disturbances=disturbances, discarded=discarded)
        margin = relative_margin(s, slo)
        s.slo_met = margin <= 0 and not m.aborted_early
        searcher.add(load, margin, s.slo_met, cut_short=m.aborted_early,
                     evidence=StepEvidence.of(m, slo) if s.slo_met else None)
        steps.append(s)
        if on_step is not None:
            on_step(s)
        return s

    first = start if start is not None else (hint[0] if hint is not None else 1.0)
    plan = step_plan(searcher, float(int(first)) if integer else first, probe=start is None and hint is None,
                     max_steps=max_steps, refine_steps=refine_steps, max_bracket=max_bracket, check=check,
                     should_stop=(lambda: should_stop(steps)) if should_stop is not None else None)
    load, probe = next(plan)
    while True:
        s = await step(load, probe)
        if len(steps) == 1 and trace_rate is not None and upper is None:
            # a trace sped up past "all at once" offers no more load
            searcher.upper = replay_upper(workload, steps[0].measurement,
                                          replay_requests(workload, requests_per_step, warmup))
        try:
            load, probe = plan.send(s.slo_met)
        except StopIteration:
            break
    lo, hi = searcher.bracket()
    best = _step_at(steps, lo[0]) if lo else None
    notes, flags = [], []
    if trace_rate is not None and lo is not None and lo[0] >= searcher.upper:
        notes.append(replay_cap_note(lo[0]))
    saturated = [s for s in steps if s.measurement.client.saturated]
    if saturated:
        notes.append("client saturated at load " + ", ".join(f"{s.load:g}" for s in saturated)
                     + f" ({saturated[0].measurement.client.note}): those steps' latencies are not trusted")
        flags.append(mflags.CLIENT_SATURATED)
    flattered = [s.load for s in steps
                 if mflags.prefix_flattered(s.measurement.metrics.get("prefix_cache_hit_pct"), workload.kind)]
    if flattered:
        notes.append("the prefix cache served random prompts at load " + ", ".join(f"{x:g}" for x in flattered)
                     + ": those steps' latencies are flattered")
        flags.append(mflags.PREFIX_HITS)
    for s in steps:
        if s.disturbances:
            notes.append(f"step at {s.load:g} re-run: {s.disturbances[0]}"
                         + (f"; its re-run too, kept ({mflags.JIT_COMPILE})" if len(s.disturbances) > 1 else ""))
    if any(len(s.disturbances) > 1 for s in steps):
        flags.append(mflags.JIT_COMPILE)
    if is_wide((lo, hi), integer, searcher.upper, max_bracket):
        flags.append(mflags.WIDE_BRACKET)
        notes.append(f"wide bracket: met at {lo[0]:g}, " + (f"broke at {hi[0]:g}" if hi else "never broke")
                     + f" (wider than {max_bracket:.0%} after {searcher.refined} extra step(s)): the capacity is a lower bound")
    per_step = replay_requests(workload, requests_per_step, warmup) if trace_rate is not None else requests_per_step
    if best is not None and best.measurement.load.get("num_requests", 0) < per_step:
        notes.append("capacity measured by the single-stream probe only")
    return CapacityResult(mode=search, capacity=lo[0] if lo else None, at_capacity=best.measurement if best else None,
                          steps=steps, cache_reset=cache_reset, note="; ".join(notes),
                          bracket=(lo[0] if lo else None, hi[0] if hi else None), flags=mflags.merge(flags))


def step_requests(load: float, probe: bool, integer: bool, requests_per_step: int, min_waves: int,
                  min_step_s: float | None) -> tuple[int, int]:
    """(counted requests, first-wave requests) of one step. A closed loop at concurrency c counts at
    least `min_waves` x c requests after a first wave of c; an open loop at rate r counts at least
    r x `min_step_s` (its arrivals are spread already, there is no synchronized burst to drop)."""
    if probe:
        return min(requests_per_step, PROBE_REQUESTS), 0
    if integer:
        c = int(load)
        return max(requests_per_step, min_waves * c), (c if c > 1 and min_waves > 0 else 0)
    if min_step_s:
        return max(requests_per_step, math.ceil(load * min_step_s)), 0
    return requests_per_step, 0


def study_hint(brackets: Iterable[Sequence[float | None] | None], max_streams: int | None = None
               ) -> tuple[float, float | None] | None:
    """The `hint` for a study's next search: the median highest met and median lowest broken load of
    the brackets measured so far (None before the first). `max_streams`, a concurrency search's
    candidate's max-num-seqs, caps it: more streams than it batches queue for a slot."""
    measured = [b for b in brackets if b and b[0] is not None]
    if not measured:
        return None
    lo = statistics.median(float(b[0]) for b in measured)
    broken = [float(b[1]) for b in measured if b[1] is not None]
    if max_streams is not None and 1 < max_streams < lo:
        return float(max_streams), None
    hi = statistics.median(broken) if broken else None
    return lo, hi if hi is not None and hi > lo else None


def _step_at(steps: list[LoadStep], load: float) -> LoadStep | None:
    matches = [s for s in steps if s.load == load and s.slo_met]
    return matches[-1] if matches else None


def capacity_objectives(result: CapacityResult) -> dict[str, float | None]:
    """The trial runner's objectives: `capacity_tps` (output tokens/s at capacity, over the step's
    fully-loaded window where there is one) and `p50_tpot_ms` there."""
    m: Measurement | None = result.at_capacity
    if m is None:
        return {"capacity_tps": None, "p50_tpot_ms": None}
    return {"capacity_tps": capacity_tps(m.metrics), "p50_tpot_ms": m.metrics.get("median_tpot_ms")}
