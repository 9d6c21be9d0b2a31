"""`autotune export`: the winning (or a chosen) trial as a file, or a folder, someone can deploy."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Callable

from autotune.errors import UserError
from autotune.export.choice import exported_trial
from autotune.export.files import write_folder_atomic, write_text_atomic
from autotune.export.formats import FORMATS
from autotune.export.options import ExportContext
from autotune.pdlayout import split_pd_flags
from autotune.store.repository import ResultStore


def _file_formats() -> dict[str, Callable[[ExportContext], str]]:
    from autotune.export.container import docker_line
    from autotune.export.k8s import k8s_manifests

    out: dict[str, Callable[[ExportContext], str]] = {
        name: (lambda ctx, f=f: f(ctx.study, ctx.trial, verdict=ctx.header, quality=ctx.quality()))
        for name, f in FORMATS.items()}
    out.update({"docker": docker_line, "k8s": k8s_manifests})
    return out


def export_command(args: argparse.Namespace) -> int:
    store = ResultStore(args.storage, create=False)
    study = store.resolve_study(args.study_name)
    trials = store.trials(study.id)
    choice = exported_trial(study, trials, store.confirmations(study.id), args.trial,
                            accept_flagged=getattr(args, "accept_flagged", False),
                            output_preserving=getattr(args, "output_preserving", False))
    for w in choice.warnings:
        sys.stderr.write(f"autotune: warning: {w}\n")
    if choice.trial is None:
        sys.stderr.write(f"autotune: {choice.reason}\n")
        return 1
    layout, _ = split_pd_flags(choice.trial.flags or [])
    if layout is not None and args.format not in ("command", "json"):
        raise UserError(f"trial {choice.trial.number} is a prefill/decode split ({layout.label}): --format command "
                        f"writes its launch and json its record; {args.format} describes one server (choose "
                        "another trial with --trial)")
    engine_cmd = None
    if getattr(args, "engine_cmd", None):
        try:
            engine_cmd = shlex.split(args.engine_cmd)
        except ValueError as e:
            raise UserError(f"--engine-cmd: {e}") from None
        if not engine_cmd:
            raise UserError("--engine-cmd is empty")
    ctx = ExportContext(store, study, trials, choice.trial, image=getattr(args, "image", None), engine_cmd=engine_cmd,
                        header=choice.header)
    if args.format == "deploy-kit":
        from autotune.export.deploy_kit import kit_files

        if args.output == "-":
            raise UserError("deploy-kit writes a folder: give -o DIR")
        out = write_folder_atomic(args.output, kit_files(ctx), keep=("run",))
    else:
        text = _file_formats()[args.format](ctx)
        if args.output == "-":
            sys.stdout.write(text)
            return 0
        out = write_text_atomic(args.output, text)
    print(f"wrote {out} (study {study.name}, trial {choice.trial.number})")
    return 0
