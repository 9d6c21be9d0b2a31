"""A continuous-batching scheduler in simulated time, shaped like vLLM v1's:

each step first advances the running sequences (decodes, then unfinished prefill chunks) within the
token budget (max-num-batched-tokens), preempting the newest running sequence when the KV cache has
no free block (recompute preemption), then admits waiting requests up to max-num-seqs, reusing
prefix-cache hits and chunking prompts when chunked prefill is on. The step's duration comes from
the roofline model; `advance` applies it and samples one token for every sequence whose context is
complete. A request with images runs the vision encoder in the step that first schedules it (its image
tokens are part of its prompt); the images encoded in one step are capped by the encoder budget,
max(max-num-batched-tokens, one image's tokens), as vLLM's encoder compute budget caps them.

Data-parallel replicas are modelled as one scheduler with DP x the seats, budget and KV blocks:
vLLM runs MoE replicas in lockstep, and the step model divides the work evenly.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from autotune.perfmodel.memory import headroom_gib, max_tokens_per_image, runtime_transient_gib
from autotune.perfmodel.predict import Plan
from autotune.perfmodel.roofline import StepCost, StepModel


class SimulatedOOM(Exception):
    """A busy step needed more memory than --gpu-memory-utilization left free on the device."""


@dataclass
class SimRequest:
    rid: str
    prompt_len: int
    max_tokens: int
    arrival: float
    block_hashes: Sequence[int] = ()
    num_computed: int = 0
    output_len: int = 0
    cached_tokens: int = 0
    blocks: int = 0
    token_times: list[float] = field(default_factory=list)
    finished: bool = False
    running: bool = False
    preemptions: int = 0
    on_token: Callable[["SimRequest", float], None] | None = None
    encoder_tokens: int = 0        # image tokens of the prompt (the encoder budget counts these)
    encoder_flops: float = 0.0     # the vision encoder's work for the request's images
    encoded: bool = False
    remote_cached: int = 0         # prompt tokens whose KV a prefill instance handed over (PD decode side)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass
class Step:
    """What one step scheduled: (request, new tokens) pairs and its cost."""

    items: list[tuple[SimRequest, int]]
    cost: StepCost
    num_prefill_tokens: int
    num_decode: int


def prompt_block_hashes(tokens: Sequence[object], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a prompt, as vLLM keys its prefix cache."""
    out, prev = [], 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[i:i + block_size])))
        out.append(prev)
    return out


class Scheduler:
    def __init__(self, plan: Plan, seed: int = 0, noise: float = 0.0):
        cfg = plan.config
        self.plan = plan
        self.cfg = cfg
        self.model = StepModel(plan.profile, cfg, plan.gpu)
        self.block_size = cfg.block_size
        self.total_blocks = plan.budget.num_blocks * cfg.dp
        self.free_blocks = self.total_blocks
        self.max_seqs = cfg.max_num_seqs * cfg.dp
        self.budget = cfg.max_num_batched_tokens * cfg.dp
        self.encoder_budget = max(cfg.max_num_batched_tokens, max_tokens_per_image(plan.profile, cfg)) * cfg.dp
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.cache: OrderedDict[int, None] = OrderedDict()   # evictable prefix-cache blocks (LRU)
        self.headroom = headroom_gib(plan.gpu, cfg)
        self.rng = random.Random(seed)
        self.noise = noise
        # counters (vLLM metric names in sim/metrics.py)
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.busy_s = 0.0
        self.compute_busy_s = 0.0
        self.steps = 0

    # ---- queue ------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        for r in list(self.running):
            if r.rid == rid:
                self._free(r)
                r.running = False
                self.running.remove(r)
        self.waiting = deque(r for r in self.waiting if r.rid != rid)

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def reset_prefix_cache(self) -> None:
        self.cache.clear()

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0

    # ---- blocks -----------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        need = self._blocks_for(tokens) - req.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        req.blocks += need
        while len(self.cache) > self.free_blocks:   # cached blocks live in free memory: evict LRU
            self.cache.popitem(last=False)
        return True

    def _free(self, req: SimRequest) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0
        if self.cfg.prefix_caching:
            computed_full = min(req.num_computed, req.prompt_len) // self.block_size
            for h in req.block_hashes[:computed_full]:
                self.cache[h] = None
                self.cache.move_to_end(h)
            while len(self.cache) > self.free_blocks:
                self.cache.popitem(last=False)

    def _lookup(self, req: SimRequest) -> int:
        """Tokens of the prompt already in the prefix cache (whole blocks; never the last token)."""
        if not self.cfg.prefix_caching or not req.block_hashes:
            return 0
        hits = 0
        for h in req.block_hashes:
            if h not in self.cache:
                break
            hits += 1
        self.prefix_queries += req.prompt_len
        hits = min(hits, (req.prompt_len - 1) // self.block_size)   # vLLM recomputes the last token
        cached = hits * self.block_size
        self.prefix_hits += max(cached, 0)
        for h in req.block_hashes[:hits]:
            self.cache.move_to_end(h)
        return max(cached, 0)

    def _preempt(self) -> SimRequest:
        victim = self.running.pop()
        victim.running = False
        self._free(victim)
        victim.num_computed = 0
        victim.encoded = False          # recomputed from scratch: its images are encoded again
        victim.remote_cached = 0        # the handed-over KV went with its blocks: recomputed here
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self) -> Step | None:
        budget = self.budget
        items: list[tuple[SimRequest, int]] = []
        preempted_before = self.preemptions
        # --long-prefill-token-threshold: one prompt gets at most that many tokens a step while another
        # request is there to be starved (vLLM v1's scheduler; alone, a prompt takes the whole budget)
        cap = self.cfg.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.total_len - req.num_computed, budget)
            if 0 < cap < n:
                n = cap
            if n <= 0:
                i += 1
                continue
            while not self._grow(req, req.num_computed + n):
                victim = self._preempt()
                if victim is req:
                    n = 0
                    break
            if n == 0 or not req.running:
                continue
            items.append((req, n))
            budget -= n
            i += 1
        preempted_now = self.preemptions > preempted_before   # vLLM admits nobody in such a step
        encoder_left = self.encoder_budget
        encoder_flops = 0.0
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs and not preempted_now:
            req = self.waiting[0]
            if not req.encoded and req.encoder_tokens:
                if req.encoder_tokens > encoder_left and encoder_left < self.encoder_budget:
                    break               # this step's encoder budget is spent: the images wait for the next
                encoder_left -= req.encoder_tokens
            if req.num_computed == 0:
                cached = max(self._lookup(req), req.remote_cached)
            else:
                cached = req.num_computed
            remaining = req.total_len - cached
            n = min(remaining, budget)
            if 0 < cap < n and self.cfg.chunked_prefill:
                n = cap
            if not self.cfg.chunked_prefill and n < remaining:
                break
            if not self._grow(req, cached + n):
                break
            self.waiting.popleft()
            if not req.encoded and req.encoder_tokens:
                encoder_flops += req.encoder_flops
                req.encoded = True
            req.num_computed = cached
            req.cached_tokens = cached
            req.running = True
            self.running.append(req)
            items.append((req, n))
            budget -= n
        if not items:
            return None
        num_decode = new_tokens = 0
        ctx = attn = 0.0
        for r, n in items:
            c = r.num_computed
            new_tokens += n
            ctx += c + n
            if n == 1 and c >= r.prompt_len:
                num_decode += 1
                attn += c + 1
            else:
                attn += n * (c + n / 2)
        prefill_tokens = new_tokens - num_decode
        cost = self.model.step(len(items), new_tokens, ctx, attn, prefill_tokens > 0, encoder_flops)
        transient = runtime_transient_gib(self.plan.profile, self.cfg, len(self.running) // self.cfg.dp,
                                          prefill_tokens // self.cfg.dp)
        if transient > self.headroom:
            raise SimulatedOOM(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {transient:.2f} GiB. GPU 0 has a "
                f"total capacity of {self.plan.gpu.memory_gib:.2f} GiB of which {self.headroom * 1024:.2f} MiB is "
                f"free. Including non-PyTorch memory, this process has "
                f"{self.plan.budget.requested_gib:.2f} GiB memory in use.")
        if self.noise > 0:
            cost.seconds *= math.exp(self.rng.gauss(0.0, self.noise))
        return Step(items, cost, prefill_tokens, num_decode)

    def advance(self, step: Step, t_end: float) -> list[SimRequest]:
        """Apply a step that ended at simulated time t_end; returns the requests it finished."""
        self.steps += 1
        self.busy_s += step.cost.seconds
        if step.cost.compute_s > step.cost.memory_s:
            self.compute_busy_s += step.cost.seconds
        done: list[SimRequest] = []
        self.prompt_tokens_total += step.num_prefill_tokens
        generated = 0
        for req, n in step.items:
            req.num_computed += n
            if req.running and req.num_computed >= req.prompt_len + req.output_len:
                req.output_len += 1
                generated += 1
                req.token_times.append(t_end)
                if req.on_token is not None:
                    req.on_token(req, t_end)
                if req.output_len >= req.max_tokens:
                    req.finished = True
                    req.running = False
                    self._free(req)
                    done.append(req)
        self.generation_tokens_total += generated
        if done:
            self.running = [r for r in self.running if r.running]
        return done
