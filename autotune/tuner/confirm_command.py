"""`autotune confirm --storage URL [--study-name N] [--top K] [--extra E] [--repeats R]`: the confirmation of a
finished (or stopped) study, run from what its database holds: the stored spec, engine command and fixed
flags. Secrets were never stored, so engine environment values come from this shell."""

from __future__ import annotations

import argparse
import os
import time

from autotune.errors import UserError
from autotune.spec import ENV_NOT_STORED, build_spec, parse_duration
from autotune.store.repository import ResultStore
from autotune.tuner.confirm import confirm_study
from autotune.tuner.progress import Progress
from autotune.node.interrupts import Interrupted, _interrupts
from autotune.tuner.driver import expected_trial_s, log_dir_for
from autotune.tuner.trial import TrialRunner


def confirm_command(args: argparse.Namespace) -> int:
    from autotune.tuner.command import build_engine, telemetry_for

    store = ResultStore(args.storage, create=False)
    study = store.resolve_study(args.study_name)
    raw = dict(study.spec or {})
    raw["storage"] = args.storage
    engine_raw = dict(raw.get("engine") or {})
    env = {}
    for key, value in (engine_raw.get("env") or {}).items():
        if value == ENV_NOT_STORED:
            if key not in os.environ:
                raise UserError(f"engine env {key} is not stored (secrets never are): set it in the environment")
            value = os.environ[key]
        env[key] = value
    engine_raw["env"] = env
    raw["engine"] = engine_raw
    spec = build_spec(raw, f"study {study.name!r} as stored")
    top = spec.confirm.top_k if args.top is None else args.top
    extra = spec.confirm.max_extra if getattr(args, "extra", None) is None else args.extra
    repeats = spec.confirm.repeats if args.repeats is None else args.repeats
    if top < 1:
        raise UserError("--top must be at least 1")
    if extra < 0:
        raise UserError("--extra must be 0 or more")
    if repeats < 3:
        raise UserError("--repeats must be at least 3: fewer paired rounds give no interval worth reading")
    budget_s = parse_duration(args.timeout) if args.timeout is not None else None
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    engine = build_engine(spec, list(study.engine_command))
    log_dir = log_dir_for(spec)
    log_dir.mkdir(parents=True, exist_ok=True)
    runner = TrialRunner(spec, engine, telemetry_for(spec), store, log_dir, list(study.fixed_flags), None)
    stopped = None
    with Progress(study.name, [o for o, _ in study.objectives], 0, live=False) as progress:
        with _interrupts(None, None):  # type: ignore[arg-type]
            try:
                result = confirm_study(spec, store, study, runner, top_k=top, repeats=repeats,
                                       max_extra=extra,
                                       phase=progress.phase, say=progress.message, deadline=deadline,
                                       expected_s=expected_trial_s(store.trial_times(study.id)) or 0.0,
                                       budget_s=budget_s)
                stopped = result.stopped_by
            except Interrupted as e:
                stopped = e.reason
    print(f"study {study.name}: confirmation " + (f"stopped by {stopped} (run again to continue)" if stopped
                                                   else "done") + f"; see `autotune show --storage {args.storage}`")
    return {None: 0, "SIGINT": 130, "SIGTERM": 143}.get(stopped, 0)

