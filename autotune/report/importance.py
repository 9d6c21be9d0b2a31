"""Parameter importance over measured trials only.

Optuna's own importance (and optuna-dashboard's) reads every COMPLETE trial, and a failed candidate is
told to Optuna as a COMPLETE trial with placeholder values (so that the sampler learns to avoid it):
importance computed there would explain the placeholders. Here an in-memory study is built from the
trials autotune measured, with the values from autotune's own table, and Optuna's PED-ANOVA evaluator (no
scikit-learn needed) runs on it, one objective at a time.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import optuna
from optuna.distributions import BaseDistribution

from autotune.store.models import StudyRecord, TrialRecord

MIN_TRIALS = 3


def measured(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Trials with measured objective values (feasible or not), never failed ones."""
    return [t for t in trials if t.objectives and t.state in ("ok", "infeasible")]


def _distributions(storage_url: str, study_name: str) -> dict[int, dict[str, BaseDistribution]]:
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    return {t.number: dict(t.distributions) for t in study.get_trials(deepcopy=False)}


def measured_study(storage_url: str, study: StudyRecord, trials: Sequence[TrialRecord]) -> optuna.Study:
    """An in-memory Optuna study holding the measured trials only, with autotune's measured values (the
    distributions come from the stored Optuna trials; `user_attrs["number"]` is the trial number)."""
    dists = _distributions(storage_url, study.name)
    names = [o for o, _ in study.objectives]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    mem = optuna.create_study(directions=[d for _, d in study.objectives])
    for t in measured(trials):
        d = dists.get(t.number, {})
        params = {k: v for k, v in (t.params or {}).items() if k in d}
        if not params or any(n not in t.objectives for n in names):
            continue
        mem.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: d[k] for k in params},
            values=[float(t.objectives[n]) for n in names], user_attrs={"number": t.number}))
    return mem


def param_importances(storage_url: str, study: StudyRecord,
                      trials: Sequence[TrialRecord]) -> tuple[dict[str, dict[str, float]], str]:
    """objective -> {param: importance} over measured trials, and a note saying over what (or why not)."""
    try:
        mem = measured_study(storage_url, study, trials)
    except Exception as e:   # an Optuna storage that cannot be read: the rest of the report still renders
        return {}, f"not computable: Optuna study not readable ({e})"
    if len(mem.trials) < MIN_TRIALS:
        return {}, f"needs at least {MIN_TRIALS} measured trials with parameters (has {len(mem.trials)})"
    out: dict[str, dict[str, float]] = {}
    for i, (name, direction) in enumerate(study.objectives):
        sign = -1.0 if direction == "maximize" else 1.0   # PED-ANOVA explains what makes the target low
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                out[name] = optuna.importance.get_param_importances(
                    mem, target=lambda ft, i=i, sign=sign: sign * ft.values[i],
                    evaluator=optuna.importance.PedAnovaImportanceEvaluator())
        except Exception as e:   # e.g. every trial ran the same values: the rest of the report still renders
            return {}, f"not computable: {e}"
    return out, f"over {len(mem.trials)} measured trials (failed trials' placeholder values left out)"
