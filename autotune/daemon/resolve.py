"""A spec resolved at submit time, so that a daemon on any host needs nothing but the database.

What a spec file points at from its own folder is pulled in or made absolute here: the search space is
inlined (a name or a file becomes its mapping), a local model directory and a jsonl workload become
absolute paths. The spec's own `storage:` is dropped (the daemon's storage holds the queue and the
studies), with a warning. Environment values whose name says secret are not stored: the daemon takes
them from its own environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autotune.errors import UserError
from autotune.space import SearchSpace
from autotune.space.space import _read_yaml
from autotune.spec import build_spec, check_model, load_spec_file, parse_duration
from autotune.tuner.command import DEFAULT_TRIALS

FROM_DAEMON_ENV = "<from the daemon's environment>"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class Resolved:
    name: str
    spec: dict[str, Any]          # what the queue stores
    n_trials: int
    time_budget_s: float | None


def resolve_spec_file(path: str, *, n_trials: int | None = None, name: str | None = None,
                      warn: Callable[[str], None] = lambda _m: None) -> Resolved:
    raw = load_spec_file(path)
    base_dir = Path(path).resolve().parent
    if raw.get("storage"):
        from autotune.store.urls import mask_url
        warn(f"{path}: storage {mask_url(str(raw['storage']))} ignored: the daemon's --storage holds the study")
    raw["storage"] = None
    if name:
        raw["name"] = name
    if n_trials is not None:
        if n_trials < 1:
            raise UserError("--n-trials must be at least 1")
        raw["budget"] = {**(raw.get("budget") or {}), "n_trials": n_trials}
    spec = check_model(build_spec(raw, path), base_dir)
    space = SearchSpace.load(spec.search_space, base_dir)
    for i, cand in enumerate(spec.enqueue):
        for k, v in cand.items():
            if k not in space.params or not space.params[k].contains(v):
                raise UserError(f"enqueue[{i}]: {k}={v!r} is not in the search space")
    body = spec.model_dump()
    if not isinstance(spec.search_space, dict):
        body["search_space"] = _read_yaml(Path(space.source))
    workload = dict(body["workload"])
    if isinstance(workload.get("path"), str):
        for base in (Path.cwd(), base_dir):
            if (base / workload["path"]).is_file():
                workload["path"] = str((base / workload["path"]).resolve())
                break
    body["workload"] = workload
    body["engine"]["env"] = {k: FROM_DAEMON_ENV if _SECRET_NAME.search(k) else v
                             for k, v in spec.engine.env.items()}
    timeout = parse_duration(spec.budget.timeout) if spec.budget.timeout is not None else None
    return Resolved(spec.name, body, spec.budget.n_trials or DEFAULT_TRIALS, timeout)


def spec_for_daemon(stored: dict[str, Any], storage: str, n_trials: int, environ: dict[str, str]) -> dict[str, Any]:
    """The raw spec a daemon runs: its own storage, the queue's trial count (the time budget is the
    queue's to count), secrets from its environment."""
    raw = dict(stored)
    raw["storage"] = storage
    raw["budget"] = {"n_trials": n_trials}
    engine = dict(raw.get("engine") or {})
    env = dict(engine.get("env") or {})
    for k, v in env.items():
        if v == FROM_DAEMON_ENV:
            if k not in environ:
                raise UserError(f"study {raw.get('name')!r} needs {k} in the daemon's environment")
            env[k] = environ[k]
    engine["env"] = env
    raw["engine"] = engine
    return raw
