"""The twin's predictions in processes of their own, on the host's spare cores.

The warm start ranks a few hundred candidates with the in-process twin (warmstart.py), about a second
each: 224 s for 200 on the H200's host, in one thread of the tuner, while the baseline's server was
ready after ~70 s and its GPU waited. Here the candidates are predicted by worker processes (spawned,
not forked from the threaded tuner) in small chunks, so that whatever is ranked at any moment can be
used and the rest can follow:

- **Spare cores.** The workers run on the cores no lease of this host holds (`spare_cores`), one
  worker per core up to `MAX_WORKERS`, at least one; where no core is spare they share the host's
  cores. Always at the lowest CPU priority (nice 19): where they share a core, a server's start or a
  load client takes it first.
- **Bounded.** `limit(cores, workers)` re-pins the workers (a running process's affinity can be
  changed from outside) and retires the extra ones before their next chunk: the warm start calls it
  when the baseline's load begins, so that afterwards the ranking keeps to the cores still spare, or
  to one worker at nice 19 where none is.
- **Gone with the tuner.** Each worker dies with its parent (the parent-death signal, as vLLM servers
  do), and daemonic processes are terminated when the tuner exits; `close()` stops them at once.

    pool = TwinPool(job, candidates, cores=[4, 5, 6, 7]).start()
    pool.results()        # {candidate index: prediction or None}, as far as ranked
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from autotune.slo import SLO
from autotune.space import SearchSpace
from autotune.tuner.warmstart import Predictor, twin_predictor

MAX_WORKERS = 8     # a few hundred candidates: more processes mostly add start-up (each imports the twin)
CHUNK = 4           # candidates per task: small, so that a deadline finds little half-done


@dataclass(frozen=True)
class TwinJob:
    """What a worker needs to build the twin predictor itself (a closure does not cross processes)."""

    model: str
    gpu: str | None
    num_gpus: int
    fixed_flags: tuple[str, ...]
    space: SearchSpace
    workload: Mapping[str, Any]
    slo: SLO
    requests: int

    def predictor(self) -> Predictor | None:
        return twin_predictor(self.model, self.gpu, self.num_gpus, list(self.fixed_flags), self.space,
                              dict(self.workload), self.slo, requests=self.requests)


def spare_cores(held: Iterable[int], host_cores: Sequence[int] | None = None) -> list[int]:
    """This process's cores that no lease holds (`held`: the cores of the host's running leases)."""
    mine = sorted(os.sched_getaffinity(0)) if host_cores is None else list(host_cores)
    taken = set(held)
    return [c for c in mine if c not in taken]


@dataclass
class TwinPool:
    """Predicts `candidates` with `job`'s twin in `workers` processes on `cores` (see the module's text)."""

    job: TwinJob | None
    candidates: Sequence[dict[str, Any]]
    cores: Sequence[int]
    workers: int = 0                 # 0: one per core, up to MAX_WORKERS
    predict: Predictor | None = None   # rank in a thread of this process with it instead (a predictor that
    #                                    cannot cross processes, e.g. a test's stand-in)
    nice: int = 19                   # the workers' CPU priority (19: the lowest)
    _got: dict[int, Any] = field(default_factory=dict, init=False)
    _error: str | None = field(default=None, init=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False)
    _procs: list[Any] = field(default_factory=list, init=False)

    @property
    def processes(self) -> int:
        return len(self._procs)

    def start(self) -> "TwinPool":
        if self.predict is not None:
            self._expected = len(self.candidates)
            threading.Thread(target=self._rank_here, name="warm-start-rank", daemon=True).start()
            return self
        ctx = multiprocessing.get_context("spawn")
        chunks = [list(range(i, min(i + CHUNK, len(self.candidates)))) for i in range(0, len(self.candidates), CHUNK)]
        n = max(1, min(self.workers or len(self.cores) or 1, MAX_WORKERS, len(chunks) or 1))
        self._tasks = ctx.Queue()
        self._results = ctx.Queue()
        self._allowed = ctx.Value("i", n)
        for idx in chunks:
            self._tasks.put([(i, self.candidates[i]) for i in idx])
        for _ in range(n):
            self._tasks.put(None)
        self._expected = len(self.candidates)
        cores = tuple(self.cores) or tuple(sorted(os.sched_getaffinity(0)))
        assert self.job is not None
        for w in range(n):
            p = ctx.Process(target=_work, args=(self.job, self._tasks, self._results, self._allowed, w, cores, self.nice),
                            name=f"twin-rank-{w}", daemon=True)
            p.start()
            self._procs.append(p)
        threading.Thread(target=self._collect, name="twin-rank-collect", daemon=True).start()
        if not self.candidates:
            self._done.set()
        return self

    def results(self) -> dict[int, Any]:
        """Candidate index -> the twin's prediction (None: it cannot start), for those ranked so far."""
        return dict(self._got)

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def error(self) -> str | None:
        """Why a worker gave up (the twin raised), or None."""
        return self._error

    def limit(self, cores: Sequence[int], workers: int) -> None:
        """From now on: at most `workers` processes (the others leave before their next chunk), on `cores`."""
        if self.predict is not None:
            return
        self._allowed.value = max(1, workers)
        for p in self._procs:
            if p.is_alive() and cores:
                try:
                    os.sched_setaffinity(p.pid, cores)
                except OSError:
                    pass      # it just ended

    def close(self) -> None:
        """Stop the workers now (what they were predicting is dropped)."""
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
        self._done.set()

    def _rank_here(self) -> None:
        assert self.predict is not None
        try:
            for i, cand in enumerate(self.candidates):
                self._got[i] = self.predict(cand)
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()

    def _collect(self) -> None:
        while len(self._got) < self._expected and self._error is None:
            try:
                kind, payload = self._results.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in self._procs):
                    break          # stopped (close) or all retired with chunks left: keep what came
                continue
            if kind == "error":
                self._error = payload
            else:
                self._got.update(payload)
        self._done.set()


def _work(job: TwinJob, tasks: Any, results: Any, allowed: Any, index: int, cores: tuple[int, ...],
          nice: int) -> None:
    """A worker: low priority, the given cores, dies with its parent; predicts chunks until none are left
    or it is retired."""
    from autotune.prctl import parent_death_signal

    parent_death_signal()
    os.nice(nice)
    try:
        os.sched_setaffinity(0, cores)
    except OSError:
        pass
    try:
        predict = job.predictor()
        if predict is None:
            raise RuntimeError("the twin does not apply to this model, GPU and workload")
        while index < allowed.value:
            chunk = tasks.get()
            if chunk is None:
                return
            results.put(("ok", {i: predict(c) for i, c in chunk}))
    except Exception as exc:     # the twin is advice: its failure costs the picks, never the study
        results.put(("error", f"{type(exc).__name__}: {exc}"))
