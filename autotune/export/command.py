"""`autotune export`: the winning (or a chosen) trial as a file someone can deploy."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from autotune.errors import UserError
from autotune.export.formats import FORMATS
from autotune.report.confirmed import export_header
from autotune.store.queries import is_feasible
from autotune.store.repository import ResultStore
from autotune.tuner.verdict import ExportChoice, export_choice, summarize_confirmations, unconfirmed_flagged


def export_command(args: argparse.Namespace) -> int:
    store = ResultStore(args.storage, create=False)
    study = store.resolve_study(args.study_name)
    trials = store.trials(study.id)
    rows = store.confirmations(study.id)
    if args.trial is not None:
        trial = next((t for t in trials if t.number == args.trial), None)
        if trial is None:
            raise UserError(f"study {study.name!r} has no trial {args.trial}")
        if not trial.objectives and trial.state != "ok":
            raise UserError(f"trial {args.trial} did not run to a measurement ({trial.state}: {trial.cause})")
        refused = unconfirmed_flagged(trial, rows, study, trials)
        if refused:
            sys.stderr.write(f"autotune: {refused}\n")
            return 1
        if not is_feasible(trial):
            sys.stderr.write(f"autotune: warning: trial {trial.number} is not feasible ({trial.state})\n")
        choice = ExportChoice(trial, None, f"trial {trial.number} chosen with --trial")
    else:
        choice = export_choice(study, trials, rows)
        if choice.trial is None:
            sys.stderr.write(f"autotune: nothing to export from study {study.name!r}: {choice.why}\n")
            return 1
        trial = choice.trial
    header = export_header(study, trials, summarize_confirmations(study, trials, rows), choice)
    text = FORMATS[args.format](study, trial, verdict=header)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.parent and not out.parent.exists():
        raise UserError(f"cannot write {out}: folder {out.parent} does not exist")
    # write-then-rename: a half-written config is never left behind
    fd, tmp = tempfile.mkstemp(dir=out.parent or Path("."), prefix=f".{out.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    print(f"wrote {out} (study {study.name}, trial {trial.number})")
    return 0
