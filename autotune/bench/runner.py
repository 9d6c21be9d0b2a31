"""One load run: warm up, offer load by an arrival process, time every request, summarize.

The tuner's trial runner and `autotune bench` both come through `run_load`, so a number in a study and
a number on the command line are the same measurement.
"""

from __future__ import annotations

import asyncio
import math
import time
from itertools import islice
from typing import Iterator

import aiohttp

from autotune.bench.abort import EarlyAbort
from autotune.bench.arrivals import Arrivals, ClosedLoop, OpenLoop, TraceReplay
from autotune.bench.client import Live, StreamClient
from autotune.bench.health import LoopMonitor
from autotune.bench.metrics import steady_output_throughput, summarize
from autotune.bench.replay import held_schedule
from autotune.bench.results import Measurement, RequestRecord
from autotune.bench.tokens import load_tokenizer
from autotune.bench.workloads import Prompt, TraceWorkload, Workload
from autotune.errors import UserError
from autotune.slo import SLO
from autotune.telemetry.metrics import VllmReading, spec_decode_stats

DEFAULT_NUM_REQUESTS = 200
PREOPEN_MAX = 256      # sockets opened before a step's clock starts, at most
ABORT_POLL_S = 0.05   # how often in-flight requests are checked against TTFT/E2EL limits
COUNTER_READS = 3            # tries at the server's /metrics before a run goes without its counters
COUNTER_READ_TIMEOUT_S = 10  # each try's limit: a loaded host's server can be seconds late with the page
COUNTER_RETRY_PAUSE_S = 0.5


def _arrivals(concurrency: int | None, rate: float | None, burstiness: float, seed: int,
              num_requests: int | None, time_scale: float | None = None) -> Arrivals:
    if time_scale is not None:
        if concurrency is not None or rate is not None:
            raise UserError("a trace replay sends at the trace's times: give no concurrency or rate with it")
        return TraceReplay(time_scale)
    if concurrency is not None and concurrency < 1:
        raise UserError(f"concurrency must be >= 1, got {concurrency}")
    if rate is not None and not rate > 0:
        raise UserError(f"rate must be > 0 req/s, got {rate}")
    if not burstiness > 0:
        raise UserError(f"burstiness must be > 0, got {burstiness}")
    if rate is None and concurrency is None:
        raise UserError("give a load: a concurrency (closed loop) or a request rate (open loop)")
    if rate is None:
        assert concurrency is not None
        return ClosedLoop(concurrency)
    return OpenLoop(rate, burstiness, seed, cap=concurrency, exact_n=num_requests)


def _preopen(concurrency: int | None, rate: float | None, num_requests: int | None) -> int:
    """How many sockets a step opens before its clock (StreamClient.open_connections): a closed loop
    keeps `concurrency` requests in flight; an open loop sends its first second's requests at once at
    most (all of them at an infinite rate); a trace replay may have each of its requests in flight at
    once (a burst). Capped: more are opened as needed, and a server closes idle ones after its keep-alive
    (vLLM: 5 s), so a long replay opens again later."""
    if concurrency is not None:
        n = concurrency
    elif rate is not None and math.isfinite(rate):
        n = math.ceil(rate)
    else:
        n = num_requests or PREOPEN_MAX
    return min(n, PREOPEN_MAX)


async def check_server(client: StreamClient) -> None:
    """Fail with one line before any load if nothing answers at the URL (any HTTP answer will do)."""
    try:
        async with client.session.get(client.base_url + "/v1/models",
                                      timeout=aiohttp.ClientTimeout(total=10)) as resp:
            await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        raise UserError(f"cannot reach the server at {client.base_url}: {str(e) or type(e).__name__}") from None


async def run_load(base_url: str, model: str, workload: Workload, *, concurrency: int | None = None,
                   rate: float | None = None, burstiness: float = 1.0, num_requests: int | None = None,
                   duration_s: float | None = None, warmup: int = 0, slo: SLO | None = None, seed: int = 0,
                   endpoint: str = "completions", tokenizer: str | None = None, timeout_s: float = 600,
                   abort_on_slo: bool = False, settle: int = 0,
                   stall_timeout_s: float | None = None, api_key: str | None = None,
                   time_scale: float | None = None) -> Measurement:
    """Measure one load level. `concurrency` alone: closed loop; `rate` (req/s, may be inf): open loop,
    Poisson or gamma by `burstiness`, capped at `concurrency` if both are given; `time_scale` (or a trace
    workload with neither): the trace's recorded times, scaled. Bounded by `num_requests` (default 200; a
    trace: its window once) or `duration_s`. `abort_on_slo` ends the run once `slo` is clearly lost
    (capacity search); in-flight requests are then cancelled and not counted.

    `settle` requests are sent first under the same load but kept out of the figures: a closed loop's
    first wave leaves together and queues its prefills behind each other, which measures the start, not
    the server. They are summarized on their own (`Measurement.first_wave`); the figures then run from
    the first counted request's dispatch, and `num_requests` counts only counted requests."""
    if num_requests is not None and num_requests < 1:
        raise UserError(f"num_requests must be >= 1, got {num_requests}")
    if duration_s is not None and not duration_s > 0:
        raise UserError(f"duration must be > 0 s, got {duration_s}")
    if warmup < 0:
        raise UserError(f"warmup must be >= 0, got {warmup}")
    if settle < 0:
        raise UserError(f"settle must be >= 0, got {settle}")
    if workload.max_images and endpoint != "chat":
        raise UserError(f"workload {workload.kind} sends images, which go to the chat endpoint: use --endpoint chat "
                        "(load.endpoint: chat in a study)")
    replay = isinstance(workload, TraceWorkload) and concurrency is None and rate is None
    if replay and time_scale is None:
        time_scale = workload.time_scale   # type: ignore[attr-defined]
    if num_requests is None and duration_s is None:
        num_requests = workload.size if replay else DEFAULT_NUM_REQUESTS   # type: ignore[attr-defined]
    arrivals = _arrivals(concurrency, rate, burstiness, seed, num_requests + settle if num_requests else None,
                         time_scale)
    tok = load_tokenizer(tokenizer, model)
    stream = workload.iter_prompts(seed, tok)
    warm = list(islice(stream, warmup))
    measured: Iterator[Prompt] = iter(list(islice(stream, num_requests + settle))) if num_requests else stream

    async with StreamClient(base_url, model, endpoint=endpoint, timeout_s=timeout_s, tokenizer=tok,
                            stall_timeout_s=stall_timeout_s, api_key=api_key) as client:
        await check_server(client)
        if warm:
            warm_sink: list[RequestRecord] = []

            async def send_warm(p: Prompt, scheduled: float | None = None) -> None:
                warm_sink.append(await client.request(p))

            await ClosedLoop(min(len(warm), concurrency or len(warm))).drive(
                iter(warm), send_warm, deadline=None, stop=asyncio.Event())
            if not any(r.ok for r in warm_sink):
                raise UserError(f"every warm-up request failed: {warm_sink[0].error}")
        await client.open_connections(_preopen(concurrency, rate, num_requests))
        return await _measure(client, arrivals, measured, num_requests, duration_s, slo, abort_on_slo,
                              concurrency, {"warmup": warmup, "seed": seed, "workload": workload.params(),
                                            "endpoint": endpoint, "num_requests": num_requests,
                                            "duration_s": duration_s, "settle": settle}, settle)


async def prefix_counters(client: StreamClient, attempts: int = COUNTER_READS,
                          timeout_s: float = COUNTER_READ_TIMEOUT_S) -> VllmReading | None:
    """The server's prefix-cache (and speculative-decoding) counters from /metrics, or None where it has
    none. Read around the measured requests so a run can say how much of its prompt work the cache
    served: prompts replayed into a warm cache (same seed twice, a reset that did not happen) make
    latencies look better than the configuration is; and how many draft tokens were accepted.

    A read that fails (a timeout, a refused or broken connection, an answer other than 200 or 404) is
    tried again: one lost reading on either side of the run loses the run's acceptance rate and hit
    share, and a server on a busy host can be seconds late with its /metrics page. A 404 is a server
    without /metrics and is not asked again."""
    for attempt in range(attempts):
        try:
            async with client.session.get(client.base_url + "/metrics",
                                          timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if r.status == 404:
                    return None
                if r.status == 200:
                    reading = VllmReading.from_text(await r.text())
                    if reading.prefix_queries_total is None and reading.spec_draft_tokens_total is None:
                        return None
                    return reading
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, UnicodeDecodeError):
            pass
        if attempt + 1 < attempts:
            await asyncio.sleep(COUNTER_RETRY_PAUSE_S)
    return None


def prefix_hit_pct(before: VllmReading | None, after: VllmReading | None) -> float | None:
    """Prompt tokens served from the prefix cache between two readings, in % of those looked up."""
    if before is None or after is None or after.prefix_hits_total is None or before.prefix_hits_total is None:
        return None
    queries = (after.prefix_queries_total or 0) - (before.prefix_queries_total or 0)
    hits = after.prefix_hits_total - before.prefix_hits_total
    if queries <= 0 or hits < 0:
        return None
    return 100.0 * hits / queries


async def _measure(client: StreamClient, arrivals: Arrivals, prompts: Iterator[Prompt], num_requests: int | None,
                   duration_s: float | None, slo: SLO | None, abort_on_slo: bool, concurrency: int | None,
                   load: dict, settle: int = 0) -> Measurement:
    records: list[RequestRecord] = []
    first_wave: list[RequestRecord] = []
    dispatched = [0]
    live: dict[int, Live] = {}
    stop = asyncio.Event()
    aborter = None
    if abort_on_slo and slo is not None:
        # a closed loop's first wave starts together and queues its prefills: judge after two waves, the
        # first of them counted in `records` only when it is not the settle wave kept apart (with it kept
        # apart, two counted waves were every request of a 2-wave step: the rule could never end one early)
        aborter = EarlyAbort(slo, num_requests, min_samples=max(20, 2 * (concurrency or 0) - settle))
    reason: list[str] = []

    def judge() -> None:
        if aborter is not None and not stop.is_set():
            why = aborter.check(records, live.values(), time.perf_counter())
            if why:
                reason.append(why)
                stop.set()

    async def send(p: Prompt, scheduled: float | None = None) -> None:
        slot = Live(time.perf_counter(), images=len(p.images))
        dispatched[0] += 1
        if dispatched[0] <= settle:       # the first wave: sent under load, summarized apart
            first_wave.append(await client.request(p, slot))
            return
        key = id(slot)
        live[key] = slot
        try:
            records.append(await client.request(p, slot, scheduled))
        finally:
            live.pop(key, None)
        judge()

    async def watch() -> None:
        while not stop.is_set():
            await asyncio.sleep(ABORT_POLL_S)
            judge()

    before = await prefix_counters(client)
    monitor = LoopMonitor()
    monitor.start()
    client.sim_span = None  # warm-up requests are not part of the run
    t0 = time.perf_counter()
    deadline = t0 + duration_s if duration_s else None
    drive = asyncio.create_task(arrivals.drive(prompts, send, deadline=deadline, stop=stop))
    watcher = asyncio.create_task(watch()) if aborter is not None else None
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({drive, stopper}, return_when=asyncio.FIRST_COMPLETED)
    cancelled = len(live)
    if not drive.done():
        drive.cancel()
    try:
        await drive
    except asyncio.CancelledError:
        pass
    t1 = time.perf_counter()
    for task in (watcher, stopper):
        if task is not None:
            task.cancel()
    await monitor.stop()
    health = monitor.health()
    sim = client.sim_span  # on the simulator, the run's length in simulated seconds
    t_count = min((r.start_s for r in records), default=t0) if first_wave else t0
    if sim:
        duration = (sim[1] - sim[0]) * ((t1 - t_count) / max(t1 - t0, 1e-9))
    else:
        duration = t1 - t_count
    metrics = summarize(records, duration, slo)
    desc = arrivals.describe()
    health = held_schedule(health, metrics, str(desc.get("mode")))
    if desc.get("request_rate") is not None and not math.isinf(float(desc["request_rate"] or 0)):
        metrics["request_rate"] = float(desc["request_rate"] or 0)
    if desc.get("concurrency") is not None:
        metrics["concurrency"] = float(desc["concurrency"] or 0)
    # the fully-loaded window starts where the counted requests do; first-wave stragglers' tokens in it count
    steady = None if sim else steady_output_throughput([*first_wave, *records], t_count)   # sim: not wall times
    if steady is not None:
        metrics["steady_output_throughput"] = steady
    after = await prefix_counters(client)
    hit_pct = prefix_hit_pct(before, after)
    if hit_pct is not None:
        metrics["prefix_cache_hit_pct"] = hit_pct
    metrics.update(spec_decode_stats(before, after))   # speculative decoding's acceptance, when it ran
    return Measurement(metrics=metrics, records=records, client=health, first_wave=first_wave,
                       load={**desc, **load, "t0_monotonic": t0, "cancelled": cancelled if reason else 0,
                             "abort_reason": reason[0] if reason else None},
                       aborted_early=bool(reason))
