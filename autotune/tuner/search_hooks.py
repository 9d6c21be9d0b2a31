"""The study driver's side of the search policy (tuner/policy.py): StudyDriver (tuner/driver.py) calls
each function from one place, with itself as `loop`.

- `open_policy`: the policy, with what the study already learned (limits, flags run) restored.
- `warm_start`: on a new study, the twin's best picks enqueued after the baseline (tuner/warmstart.py),
  ranked in processes of their own while the baseline's server starts (tuner/warm_ranking.py).
- `screen`: a duplicate or a candidate outside a learned limit is told without a launch and not counted.
- `predict`: the twin's prediction and rank stored beside the trial.
- `stopper`: the early-stopping check handed to the trial's capacity search.
- `capacity_hint`: where that search starts, from the capacities the study measured so far.
- `after_tell`: what ran is remembered; a failure that states its limit narrows the space.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import TrialState

from autotune import causes
from autotune.bench.capacity import study_hint
from autotune.flags import flags_to_mapping, with_env
from autotune.store.models import utcnow
from autotune.tuner.host import catalog_gpu_name, nvml_gpus
from autotune.tuner.narrowing import Limit
from autotune.tuner.objectives import failure_constraints, placeholder_values
from autotune.tuner.policy import DUPLICATE, FREE, SearchPolicy, duplicate_told
from autotune.tuner.twin_pool import TwinJob
from autotune.tuner.warm_ranking import RANKING_ATTR, WarmStart
from autotune.tuner.warmstart import Ranking


def study_gpu(spec: Any) -> tuple[str | None, int, float | None]:
    """The catalog name of the study's GPUs, their count and memory (GiB), as far as they are known."""
    if spec.engine.kind == "sim":
        from autotune.perfmodel import find_gpu
        g = find_gpu(spec.engine.gpu)
        return spec.engine.gpu, spec.engine.num_gpus, g.memory_gib if g else None
    gpus = [g for g in nvml_gpus() if g["index"] in spec.gpus]
    if not gpus:
        return None, len(spec.gpus), None
    return catalog_gpu_name(gpus[0]["name"]), len(gpus), gpus[0]["memory_mib"] / 1024


def open_policy(loop: Any) -> None:
    spec = loop.spec
    gpu, num, device_gib = study_gpu(spec)
    n_before = len(loop.study.get_trials(deepcopy=False))
    loop.policy = SearchPolicy(loop.space, loop.fixed_flags, spec.num_gpus, early_stop=spec.early_stop,
                               device_gib=device_gib, seed=spec.seed + 7919 * n_before)
    for doc in loop.store.limits(loop.record.id):
        loop.policy.limits.add(Limit.from_json(doc))
    for rec in loop.store.trials(loop.record.id):
        if rec.state not in ("running", "interrupted", DUPLICATE) and rec.cause != causes.WORKER_DIED:
            loop.policy.ran(with_env(rec.flags or [], rec.env), rec.number)   # (a worker that died measured nothing)
    loop.twin, loop.twin_job, loop.ranking = None, None, None
    ws = spec.warm_start
    # On by default for real engines; on the simulator only when asked (the twin ranking itself).
    if ws.source == "twin" or (ws.source == "auto" and spec.engine.kind == "vllm"):
        loop.twin, loop.twin_job = twin_source(loop, gpu, num)
        values = loop.study.user_attrs.get(RANKING_ATTR)
        if values is not None:
            loop.ranking = Ranking(spec.objectives[0], spec.directions()[0] == "maximize", list(values))


def twin_source(loop: Any, gpu: str | None, num: int) -> tuple[Any, TwinJob | None]:
    """The twin as a predictor for this process, and the job its ranking's worker processes build it
    from (None: rank in a thread instead); (None, None) where the twin does not apply."""
    spec = loop.spec
    job = TwinJob(spec.model, gpu, num, tuple(loop.fixed_flags), loop.space, dict(spec.workload), loop.slo,
                  requests=min(spec.load.requests_per_step, 96))
    predict = job.predictor()
    return predict, (job if predict is not None else None)


def warm_start(loop: Any, progress: Any) -> WarmStart | None:
    """Once per study, right after the baseline (and the spec's own candidates) are first enqueued:
    the ranking starts in its own processes (tuner/warm_ranking.py); None where it does not apply."""
    spec = loop.spec
    if loop.twin is None or spec.warm_start.k == 0 or RANKING_ATTR in loop.study.user_attrs:
        return None
    if loop.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None   # a study that already measured something (e.g. created before warm starts existed)
    return WarmStart(loop, progress)


def predict(loop: Any, trial: Any, params: dict[str, Any]) -> None:
    """The twin's prediction for this trial (simulated), stored beside what it will measure."""
    if loop.twin is None:
        return
    pred = trial.user_attrs.get("twin_predicted")
    rank = trial.user_attrs.get("twin_rank")
    if pred is None:
        pred = loop.twin(params) or {}
        value = pred.get(loop.spec.objectives[0])
        rank = loop.ranking.rank_of(float(value)) if loop.ranking is not None and value is not None else None
    loop.store.save_prediction(loop.record.id, trial.number, rank, dict(pred))


def screen(loop: Any, trial: Any, role: str, params: dict[str, Any], flags: list[str], progress: Any) -> bool:
    """True when the candidate was settled without a launch (told to Optuna, not counted)."""
    policy: SearchPolicy = loop.policy
    found = policy.screen(params, flags, role)
    wants_random = policy.proposed(found)
    if found is None:
        return False
    told = duplicate_told(loop.study, found.earlier) if found.kind == DUPLICATE and found.earlier is not None else None
    if told is not None:
        values, constraints = told
    else:
        constraints = failure_constraints(loop.slo, loop.headroom_constraint)
        history = [t.values for t in loop.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("measured")]
        values = placeholder_values(loop.spec.objectives, history)
    for key, value in constraints.items():
        trial.set_constraint(key, float(value))
    trial.set_user_attr(FREE, True)
    trial.set_user_attr("cause", None if found.kind == DUPLICATE else found.kind)
    loop.study.tell(trial, values)
    state = DUPLICATE if found.kind == DUPLICATE else "failed"
    loop.store.save_trial(loop.record.id, trial.number, state=state,
                          cause=None if found.kind == DUPLICATE else found.kind, detail=found.detail,
                          finished_at=utcnow())
    progress.trial_finished(trial.number, role, state, None, found.detail + " (not counted)")
    if wants_random:
        cand = policy.fallback()
        if cand is not None:
            loop.study.enqueue_trial(cand, user_attrs={"role": "search", "enqueued": sorted(cand),
                                                       "random_fallback": True})
            progress.message("a stretch of duplicates: the next candidate is a random draw")
    return True


def rejected_before_launch(loop: Any, trial: Any, cause: str | None, role: str) -> bool:
    """Mark a candidate that a known constraint or the memory model rejected without a launch as not
    counting toward --n-trials; True when it was so marked. It cost no GPU time, and counted it spent the
    budget: an H200 study of a VLM ended its 8 trials with 3 measured, 5 proposals in a row breaking the
    rule that an image must fit the step's tokens. Such rejections in a row count toward the policy's
    stop (MAX_FREE_IN_A_ROW), so a space whose proposals all break a rule still ends."""
    if trial is None or role == "baseline" or cause not in (causes.CONSTRAINT, causes.PREDICTED_OOM):
        return False
    trial.set_user_attr(FREE, True)
    policy = getattr(loop, "policy", None)
    if policy is not None:
        policy.free_in_a_row += 1
    return True


def spent(loop: Any, progress: Any) -> bool:
    """True when so many proposals in a row were settled without a launch that the space is spent."""
    policy = getattr(loop, "policy", None)
    if policy is None or not policy.exhausted:
        return False
    progress.message(f"stopping: the last {policy.free_in_a_row} candidates were all duplicates or outside "
                     f"learned limits; the space has nothing new left")
    return True


def stopper(loop: Any) -> Any:
    """The early-stopping check for the next trial (None: off, or no incumbent yet)."""
    if loop.spec.load.mode != "capacity":
        return None
    front = [t.values for t in loop.feasible_trials()]
    return loop.policy.stopper(loop.spec.objectives, loop.spec.directions(), front,
                               integer=loop.spec.load.search == "concurrency")


def capacity_hint(loop: Any, flags: list[str] | None = None) -> tuple[float, float | None] | None:
    """Where the next trial's capacity search starts (bench/capacity.py `hint`): the median highest met
    and lowest broken load of the study's measured trials, or None (the probe at one stream) before the
    first, with `load.search_start: probe`, or for a trace's speed-up (its probe sets the search's cap).
    A median, not the incumbent's: a candidate below the hint costs one extra step (the probe), and most
    candidates sit near the middle. A concurrency search on a
    candidate whose `--max-num-seqs` (in `flags`) is below the median starts at that cap instead: more
    streams than it batches queue for a slot, and on the H200 every such start broke the SLO and fell
    back to the probe (7 steps instead of 4)."""
    load = loop.spec.load
    if load.mode != "capacity" or load.search_start != "study" or load.search == "time_scale":
        return None
    brackets = loop.store.brackets(loop.record.id)
    seqs = flags_to_mapping([*loop.fixed_flags, *(flags or [])]).get("max_num_seqs")
    cap = int(seqs) if load.search == "concurrency" and seqs is not None and str(seqs).isdigit() else None
    return study_hint(brackets, cap)


def after_tell(loop: Any, number: int, params: dict[str, Any], flags: list[str], outcome: Any,
               progress: Any, launch: list[str] | None = None) -> None:
    """`launch`: the flags with the env knobs (flags.with_env), what deduplication remembers."""
    if outcome.cause == causes.INTERRUPTED:
        return
    loop.policy.ran(launch if launch is not None else flags, number)
    if outcome.state == "failed":
        lim = loop.policy.learn(number, outcome.cause, outcome.detail, params, flags)
        if lim is not None:
            loop.store.add_limit(loop.record.id, lim.to_json())
            progress.message(f"learned from trial {number}: {lim.param} {lim.op} {lim.value:g} ({lim.reason}); "
                             f"candidates outside it are not launched")
