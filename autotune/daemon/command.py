"""`autotune daemon`, `submit`, `status` and `cancel`. Thin: parse, then call the queue, a daemon's
API, or the service loop (daemon/service.py).

`submit`, `status` and `cancel` work on the database (`--storage URL`) or through a running daemon
(`--url http://host:port`); a daemon beyond loopback wants its token, read from `--token-file` or
AUTOTUNE_TOKEN, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from autotune.cli import OneLineParser
from autotune.daemon.api import TOKEN_ENV, read_token
from autotune.errors import UserError
from autotune.store.urls import mask_url


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--storage", help="the daemon's SQLAlchemy URL (password via PGPASSWORD or ~/.pgpass)")
    g.add_argument("--url", help="a running daemon, e.g. http://127.0.0.1:8321")
    p.add_argument("--token-file", help=f"the daemon's token (else {TOKEN_ENV}); needed beyond loopback")


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request to a daemon; its refusal (400/401) or absence is a one-line UserError."""
    import httpx

    token = read_token(args.token_file)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = args.url.rstrip("/") + path
    try:
        r = httpx.request(method, url, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise UserError(f"daemon at {args.url}: {e}") from None
    try:
        data = r.json()
    except ValueError:
        data = {}
    if r.status_code != 200:
        raise UserError(f"daemon at {args.url}: {data.get('error') or f'HTTP {r.status_code}'}")
    return data


def submit_main(argv: Sequence[str]) -> int:
    p = OneLineParser(prog="autotune submit", description="queue a study for the daemon(s) on a storage")
    p.add_argument("spec", help="study spec YAML (resolved now: the daemon needs nothing but the database)")
    p.add_argument("--priority", type=int, default=0, help="higher runs first (no pre-emption)")
    p.add_argument("--n-trials", type=int, help="complete trials the study should hold")
    p.add_argument("--study-name", help="override the spec's name")
    _target(p)
    args = p.parse_args(list(argv))
    from autotune.daemon.resolve import resolve_spec_file

    r = resolve_spec_file(args.spec, n_trials=args.n_trials, name=args.study_name,
                          warn=lambda m: sys.stderr.write(f"autotune: warning: {m}\n"))
    body = {"name": r.name, "spec": r.spec, "priority": args.priority, "n_trials": r.n_trials,
            "time_budget_s": r.time_budget_s}
    if args.url:
        _call(args, "POST", "/submit", body)
        where = args.url
    else:
        from autotune.daemon.queue import submit_to
        submit_to(args.storage, body)
        where = mask_url(args.storage)
    budget = f", time budget {r.time_budget_s:.0f} s" if r.time_budget_s else ""
    print(f"queued {r.name}: {r.n_trials} trial(s), priority {args.priority}{budget}; {where}")
    return 0


def cancel_main(argv: Sequence[str]) -> int:
    p = OneLineParser(prog="autotune cancel", description="stop giving a queued study new trials")
    p.add_argument("name", help="the study's name")
    p.add_argument("--now", action="store_true",
                   help="also interrupt its running trials (their parameters stay queued for a resubmit)")
    _target(p)
    args = p.parse_args(list(argv))
    if args.url:
        _call(args, "POST", "/cancel", {"name": args.name, "now": args.now})
    else:
        from autotune.daemon.queue import StudyQueue
        StudyQueue(args.storage, create=False).cancel(args.name, now=args.now)
    print(f"cancelled {args.name}" + ("; running trials are interrupted" if args.now else
                                      "; running trials finish, no new ones start"))
    return 0


def status_main(argv: Sequence[str]) -> int:
    p = OneLineParser(prog="autotune status", description="the queue, each study's progress, the daemon's GPUs")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _target(p)
    args = p.parse_args(list(argv))
    body = _call(args, "GET", "/status") if args.url else storage_status(args.storage)
    if args.json:
        print(json.dumps(body, indent=2, default=str))
    else:
        from autotune.daemon.status import render
        print(render(body))
    return 0


def storage_status(storage: str) -> dict[str, Any]:
    """Status from the database alone: the queue, each study's trials, the daemons that beat."""
    from autotune.daemon.queue import StudyQueue
    from autotune.daemon.status import study_rows, live_daemons
    from autotune.store.repository import ResultStore, storage_exists

    queue = StudyQueue(storage, create=False)
    store = ResultStore(storage, create=False) if storage_exists(storage) else None
    return {"storage": mask_url(storage), "daemon": None, "daemons": live_daemons(queue.engine),
            "studies": study_rows(store, queue.entries()), "gpus": []}


def daemon_main(argv: Sequence[str]) -> int:
    p = OneLineParser(prog="autotune daemon", description="work through the study queue until stopped")
    p.add_argument("--gpus", required=True, help="the pool: indices or ranges, e.g. 0-7 or 0,2-3")
    p.add_argument("--storage", required=True, help="where the queue and the studies live "
                                                    "(password via PGPASSWORD or ~/.pgpass, never in the URL)")
    p.add_argument("--listen", default="127.0.0.1:8321", help="status API address (loopback unless a token is set)")
    p.add_argument("--grace", type=float, default=600.0, help="on SIGTERM, seconds running trials may finish")
    p.add_argument("--token-file", help=f"API token for a non-loopback --listen (else {TOKEN_ENV})")
    p.add_argument("--log-dir", help="log root; trial logs go to LOG_DIR/HOST/STUDY/ (default: beside an SQLite "
                                     "database, else ./autotune-logs)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between looks at the queue")
    args = p.parse_args(list(argv))
    if args.grace < 0 or args.poll <= 0:
        raise UserError("--grace must be >= 0 and --poll > 0")
    from autotune.daemon.service import Daemon

    return Daemon.from_args(args).run()
