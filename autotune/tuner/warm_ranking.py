"""The warm start as it runs beside the baseline's start: the twin ranks in worker processes on spare cores
(twin_pool.py), from its cache where it can (twin_cache.py), and the baseline's load never waits for it.

- **A deadline, not a wait.** When the baseline's server is ready (the trial runner's `before_load`), or
  when the baseline ends without a load, the picks are taken from what is ranked by then and enqueued
  right after the baseline; the workers are then held to the cores still spare (one worker at nice 19
  where none is) so they stay off the load client's cores. A ranking that finishes first settles at once.
- **The rest refines.** The workers keep ranking after the deadline. Once every candidate is ranked, the
  predictions are cached, the study's ranking (every trial's twin rank) is replaced by the full one, and
  where the full ranking's picks beat those already enqueued by more than the twin can tell apart
  (`TIE`), they are enqueued too, to run next.

Nothing else starts before the picks are enqueued (`pending`, asked by the driver), so they still run
right after the baseline. The twin is advice: its failure costs the picks, never the study.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from autotune.tuner.dedupe import flags_key
from autotune.tuner.twin_cache import RankingCache
from autotune.tuner.twin_pool import TwinPool, spare_cores
from autotune.tuner.warmstart import TIE, Pick, Ranking, complete_pick, draw_candidates, modelled_subspace, rank

RANKING_ATTR = "twin_ranking"       # study user attr: the twin's predicted values of the ranked candidates


class WarmStart:
    def __init__(self, loop: Any, progress: Any) -> None:
        spec = loop.spec
        self.loop, self.progress = loop, progress
        self.objective, self.maximize = spec.objectives[0], spec.directions()[0] == "maximize"
        self.k = spec.warm_start.k
        self.t0 = time.monotonic()
        self._lock = threading.RLock()
        self._settled = threading.Event()
        self._ranked = threading.Event()   # every candidate ranked, cached and the picks refined
        self.picks: list[Pick] = []
        self._slots = 0    # picks filled so far: the next one's place in the spread of unmodelled knobs
        # the knobs the twin models are ranked; the others are spread over the picks inside the rules
        self.space, self.sampled = modelled_subspace(loop.space)
        self.candidates = draw_candidates(self.space, loop.fixed_flags, spec.num_gpus, spec.warm_start.candidates,
                                          spec.seed)
        # a twin that cannot cross processes (no job: a test's stand-in) ranks in a thread, uncached
        job = replace(loop.twin_job, space=self.space) if loop.twin_job is not None else None
        self.cache = RankingCache(loop.log_dir.parent, job) if job is not None else None
        cached = self.cache.load() if self.cache is not None else {}
        self.known: dict[int, Any] = {i: cached[key] for i, c in enumerate(self.candidates)
                                      if self.cache is not None and (key := self.cache.key(c)) in cached}
        missing = [i for i in range(len(self.candidates)) if i not in self.known]
        self.pool: TwinPool | None = None
        loop.after_tell.append(self._baseline_ended)
        if not missing:
            progress.message(f"twin (simulated): {len(self.candidates)} candidates ranked from its cache "
                             f"({self.cache.path if self.cache is not None else ''})")
            self._finish()
            return
        cores = spare_cores(self._held())
        self.pool = TwinPool(job, [self.candidates[i] for i in missing], cores=cores,
                             predict=loop.twin if loop.twin_job is None else None).start()
        self._missing = missing
        where = (f"{self.pool.processes} process(es) on {len(cores) or 'no'} spare core(s)" if self.pool.processes
                 else "a thread")
        progress.message(f"twin (simulated) ranking {len(missing)} candidates by {self.objective} in {where} "
                         f"beside the baseline's start" + (f" ({len(self.known)} more from its cache)" if self.known else ""))
        threading.Thread(target=self._await_pool, name=f"warm-start {spec.name}", daemon=True).start()

    # -- what the driver asks ------------------------------------------------------------------------
    def pending(self) -> bool:
        """The picks are not enqueued yet: no trial but the baseline may start."""
        return not self._settled.is_set()

    def wait(self, phase: Any = None) -> None:
        """The baseline's server is ready: take the picks from what is ranked now (never blocks), and keep
        the rest of the ranking off the cores of the load that begins."""
        if self._settled.is_set():
            return
        self.settle("the baseline's server was ready")
        if self.pool is not None and not self.pool.done():
            cores = spare_cores(self._held())
            self.pool.limit(cores or spare_cores(()), workers=len(cores) if cores else 1)

    # -- settling and refining -------------------------------------------------------------------------
    def ranked(self) -> list[tuple[dict[str, Any], Any]]:
        got = dict(self.known)
        if self.pool is not None:
            got.update({self._missing[j]: pred for j, pred in self.pool.results().items()})
        return [(self.candidates[i], got[i]) for i in sorted(got)]

    def settle(self, why: str) -> None:
        """Enqueue the picks of the ranking as it stands (once)."""
        with self._lock:
            if self._settled.is_set():
                return
            try:
                predicted = self.ranked()
                self._save(predicted)       # kept if the study ends before the ranking does
                self.picks, ranking = rank(self.space, predicted, objective=self.objective,
                                           maximize=self.maximize, k=self.k, sampled=self.sampled)
                self._enqueue(self.picks, refined=False)
                self._store(ranking)
                part = "" if len(predicted) == len(self.candidates) else f" of {len(self.candidates)}"
                rest = "" if not part else "; the rest may refine later picks" if self.picks else \
                    "; no pick yet: the sampler proposes until the ranking is done"
                self.progress.message(f"warm start: {len(predicted)}{part} candidates ranked in "
                                      f"{time.monotonic() - self.t0:.0f} s when {why}" + rest
                                      + _listed(self.picks, self.objective))
            except Exception as exc:     # the twin is advice: a failure costs the picks, never the study
                self.progress.message(f"warm start failed, the sampler chooses instead: {exc}")
            finally:
                self._settled.set()

    def finished(self, timeout: float | None = None) -> bool:
        """Wait until every candidate is ranked, cached and the picks refined (True), or `timeout`."""
        return self._ranked.wait(timeout)

    def _finish(self) -> None:
        """Every candidate ranked (or the workers gave up): settle if not yet, cache, refine."""
        try:
            if self.pool is not None and self.pool.error:
                self.progress.message(f"twin ranking stopped: {self.pool.error}")
            if not self._settled.is_set():
                self.settle("its ranking was done")
                return
            predicted = self.ranked()
            self._save(predicted)
            with self._lock:
                self._refine(predicted)
        except Exception as exc:
            self.progress.message(f"warm start: the full ranking could not refine the picks: {exc}")
        finally:
            self._ranked.set()

    def _refine(self, predicted: list[tuple[dict[str, Any], Any]]) -> None:
        picks, ranking = rank(self.space, predicted, objective=self.objective, maximize=self.maximize,
                              k=self.k, sampled=self.sampled)
        self._store(ranking)
        best = [p.predicted[self.objective] for p in self.picks]
        taken = {flags_key(self.space.render(p.params)) for p in self.picks}
        better = [p for p in picks if flags_key(self.space.render(p.params)) not in taken and
                  (not best or _beats(p.predicted[self.objective], best[0], self.maximize))]
        if better and not self.loop.budget_reached():
            self._enqueue(better, refined=True)
            self.picks += better
        self.progress.message(f"warm start: all {len(predicted)} candidates ranked in "
                              f"{time.monotonic() - self.t0:.0f} s; "
                              + (f"{len(better)} better pick(s) enqueued" + _listed(better, self.objective)
                                 if better else "the picks stand"))

    def _enqueue(self, picks: list[Pick], refined: bool) -> None:
        loop = self.loop
        with loop._lock:
            for pick in picks:
                # knobs the twin does not model are spread over the picks, inside the rules (complete_pick)
                params = complete_pick(loop.space, pick, loop.fixed_flags, loop.spec.num_gpus,
                                       seed=f"{loop.spec.name}:{loop.spec.seed}", slot=self._slots)
                self._slots += 1
                if params is None:
                    self.progress.message(f"warm start: pick #{pick.rank} breaks a rule with every setting of "
                                          f"{', '.join(pick.sampled)} drawn for it: left out")
                    continue
                loop.study.enqueue_trial(params, user_attrs={
                    "role": "warm_start", "enqueued": sorted(params), "twin_rank": pick.rank,
                    "twin_predicted": pick.predicted, "twin_drawn": sorted(set(params) & set(pick.sampled)),
                    **({"twin_refined": True} if refined else {})})

    def _store(self, ranking: Ranking) -> None:
        """The study's ranking, and every stored prediction's rank against it."""
        loop = self.loop
        with loop._lock:
            loop.study.set_user_attr(RANKING_ATTR, ranking.values)
            loop.ranking = ranking
            for number, rec in loop.store.predictions(loop.record.id).items():
                value = (rec.predicted or {}).get(self.objective)
                if value is not None:
                    loop.store.save_prediction(loop.record.id, number, ranking.rank_of(float(value)),
                                               dict(rec.predicted))

    # -- plumbing --------------------------------------------------------------------------------------
    def _save(self, predicted: list[tuple[dict[str, Any], Any]]) -> None:
        if self.cache is not None:
            self.cache.save({self.cache.key(c): pred for c, pred in predicted})

    def _await_pool(self) -> None:
        assert self.pool is not None
        self.pool.wait()
        self._finish()

    def _baseline_ended(self, loop: Any, job: Any, outcome: Any) -> None:
        """An after-tell hook: a baseline that ended before its load (it failed to start) settles too."""
        if job.role == "baseline":
            self.settle("the baseline ended")

    def _held(self) -> set[int]:
        try:
            return self.loop.store.held_cores(self.loop.host)
        except Exception:
            return set()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _beats(value: float, than: float, maximize: bool) -> bool:
    """Better than `than` by more than the twin's tie."""
    return value > than + abs(than) * TIE if maximize else value < than - abs(than) * TIE


def _listed(picks: list[Pick], objective: str) -> str:
    return "".join(f"; #{p.rank} predicted {objective}={p.predicted.get(objective, 0):.4g}" for p in picks)
