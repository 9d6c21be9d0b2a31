"""The `autotune` command. Thin: parse, build objects, call in.

argparse rather than click/typer because every bad input must end as one line on stderr and exit
code 2 (click prints a usage box). Commands that pass vLLM flags through (`sim-serve`, `estimate`) and
`bench` own their parsers in their packages and receive the raw arguments.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from autotune.errors import UserError

# command -> "module:function" taking argv (list[str]) and returning an exit code
_DELEGATED: dict[str, str] = {
    "bench": "autotune.bench.command:main",
    "convert": "autotune.bench.trace.command:main",
    "sim-serve": "autotune.sim.command:serve_main",
    "estimate": "autotune.sim.command:estimate_main",
    "router": "autotune.engine.router:main",
    "daemon": "autotune.daemon.command:daemon_main",
    "submit": "autotune.daemon.command:submit_main",
    "status": "autotune.daemon.command:status_main",
    "cancel": "autotune.daemon.command:cancel_main",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as a single line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _build_parser() -> OneLineParser:
    p = OneLineParser(prog="autotune", description="Auto-tune vLLM server flags under a latency SLO.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    run = sub.add_parser("run", help="run (or resume) a tuning study")
    run.add_argument("--study", help="study spec YAML (default: ./autotune.yaml, else built from --model)")
    run.add_argument("--slo", help="e.g. ttft=1s or ttft:p95<=800ms,tpot:p99<=50ms")
    run.add_argument("--n-trials", type=int, help="total COMPLETE trials the study should hold")
    run.add_argument("--timeout", help="wall-clock limit for this invocation, e.g. 3600, 90m, 8h")
    run.add_argument("--storage", help="SQLAlchemy URL, e.g. sqlite:///studies/x.db")
    run.add_argument("--model", help="local model directory or hub id org/name")
    run.add_argument("--engine-cmd", help="engine command, e.g. 'vllm serve' (split like a shell, never run by one)")
    run.add_argument("--gpus", help="device indices, e.g. 0,1 or 0-7 (the pool trials lease from)")
    run.add_argument("--parallel", type=int, default=1,
                     help="trials at once, each on its own GPUs and cores (default 1)")
    run.add_argument("--study-name", help="override the study's name")
    run.add_argument("--no-progress", action="store_true", help="plain log lines instead of the live display")
    run.add_argument("--no-confirm", action="store_true", help="skip measuring the top candidates again at the end")

    conf = sub.add_parser("confirm", help="measure the top candidates and the baseline again on fresh servers")
    conf.add_argument("--storage", required=True)
    conf.add_argument("--study-name")
    conf.add_argument("--top", type=int, help="candidates to confirm (default: the spec's confirm.top_k)")
    conf.add_argument("--extra", type=int, help="at most this many more whose first run is within the noise of "
                                                "the best or flagged (default: the spec's confirm.max_extra)")
    conf.add_argument("--repeats", type=int, help="rounds, at least 3 (default: the spec's confirm.repeats)")
    conf.add_argument("--timeout", help="wall-clock limit, e.g. 20m: a repeat that would not finish in what "
                                        "is left is not started (the next call runs it)")
    run.add_argument("--report", metavar="FILE", help="write the study's HTML report here at the end")

    abl = sub.add_parser("ablate", help="which knobs of a trial carry its gain: the defaults plus each knob "
                                        "alone, measured in paired rounds beside the whole trial")
    abl.add_argument("--study", required=True, help="the study's spec YAML (the ablation keeps its engine, "
                                                    "workload, SLO and storage)")
    abl.add_argument("--storage", help="override the spec's storage")
    abl.add_argument("--study-name", help="the study's name in the storage, if `run` was given one")
    abl.add_argument("--trial", type=int, help="the trial to take apart (default: the one `export` writes)")
    abl.add_argument("--knobs", help="only these of its knobs, e.g. stream_interval,block_size")
    abl.add_argument("--repeats", type=int, help="paired rounds, at least 3 (default: the spec's confirm.repeats)")
    abl.add_argument("--timeout", help="wall-clock limit for this invocation, e.g. 90m (the same command resumes)")
    abl.add_argument("--dry-run", action="store_true", help="print the configurations and stop")
    abl.add_argument("--no-progress", action="store_true", help="plain log lines instead of the live display")

    show = sub.add_parser("show", help="trials, causes, metrics and the Pareto front of a study")
    show.add_argument("--storage", required=True)
    show.add_argument("--study-name")
    show.add_argument("--json", action="store_true", help="machine-readable output")

    exp = sub.add_parser("export", help="write the best (or a chosen) trial's config")
    exp.add_argument("--storage", required=True)
    exp.add_argument("--study-name")
    exp.add_argument("--format", required=True,
                     choices=["vllm-yaml", "command", "json", "docker", "k8s", "deploy-kit"])
    exp.add_argument("--trial", type=int, help="trial number (default: the confirmation's choice, else the best "
                                               "feasible unflagged trial)")
    exp.add_argument("--output-preserving", action="store_true",
                     help="the best configuration that does not change output quality (the baseline when none "
                          "beats it)")
    exp.add_argument("--accept-flagged", action="store_true",
                     help="with --trial: export it even though it carries a measurement flag and is not "
                          "confirmed (the export's header says so)")
    exp.add_argument("-o", "--output", required=True, help="file to write ('-' for stdout); a folder for deploy-kit")
    exp.add_argument("--engine-cmd", help="deploy-kit: start vLLM with this command (e.g. 'vllm serve') "
                                          "instead of the study's engine command")
    exp.add_argument("--image", help="docker, k8s: container image (default: vllm/vllm-openai pinned to the "
                                     "engine version the trial ran)")

    rep = sub.add_parser("report", help="one self-contained HTML report of a study")
    rep.add_argument("--storage", required=True)
    rep.add_argument("--study-name")
    rep.add_argument("-o", "--output", required=True, help="HTML file to write")

    diff = sub.add_parser("diff", help="two trials' flags and measurements side by side")
    diff.add_argument("--storage", required=True)
    diff.add_argument("--study-name")
    diff.add_argument("a", help="trial number or 'baseline'")
    diff.add_argument("b", help="trial number or 'baseline'")
    diff.add_argument("--json", action="store_true", help="machine-readable output")

    init = sub.add_parser("init", help="write a commented autotune.yaml")
    init.add_argument("path", nargs="?", default="autotune.yaml")
    init.add_argument("--force", action="store_true")

    demo = sub.add_parser("demo-model", help="write a tiny random-weight Llama (or, with --vlm, a vision-language "
                                              "model) with a local BPE tokenizer")
    demo.add_argument("dir")
    demo.add_argument("--vlm", choices=["idefics3", "qwen2_5_vl"],
                      help="a random-weight VLM of this architecture (needs torch and transformers)")
    demo.add_argument("--size", choices=["tiny", "7b"], default="tiny", help="with --vlm: 7b is Qwen2.5-VL-7B's shape")

    for name in _DELEGATED:
        sub.add_parser(name, help=f"see 'autotune {name} --help'", add_help=False)
    return p


def _load(target: str) -> Callable[[list[str]], int]:
    import importlib

    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] in _DELEGATED:
            code = int(_load(_DELEGATED[args_list[0]])(args_list[1:]) or 0)
        else:
            code = int(_dispatch(_build_parser().parse_args(args_list)) or 0)
        sys.stdout.flush()     # a closed pipe fails here, inside the try, not at the interpreter's exit
        return code
    except UserError as e:
        from autotune.store.urls import mask_url
        sys.stderr.write(f"autotune: error: {mask_url(str(e))}\n")
        return 2
    except BrokenPipeError:
        # the reader went away (`autotune show ... | head`): no traceback, and none either when the
        # interpreter flushes stdout on its way out; 141 is what a shell reports for SIGPIPE
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        sys.stderr.write("autotune: interrupted\n")
        return 130
    except Exception as e:  # noqa: BLE001 - only a storage that cannot be written is answered here
        from autotune.store.repository import storage_failure

        why = storage_failure(e)
        if why is None:
            raise
        sys.stderr.write(f"autotune: error: cannot write the study's storage or logs: {why}; what was "
                         "completed is kept: free space and run the same command to resume\n")
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from autotune.tuner.command import run_command
        return run_command(args)
    if args.command == "confirm":
        from autotune.tuner.confirm_command import confirm_command
        return confirm_command(args)
    if args.command == "ablate":
        from autotune.tuner.ablation import ablate_command
        return ablate_command(args)
    if args.command == "show":
        from autotune.report.show import show_command
        return show_command(args)
    if args.command == "export":
        from autotune.export.command import export_command
        return export_command(args)
    if args.command == "report":
        from autotune.report.html import report_command
        return report_command(args)
    if args.command == "diff":
        from autotune.report.diff import diff_command
        return diff_command(args)
    if args.command == "init":
        from autotune.spec import write_init
        return write_init(args.path, force=args.force)
    if args.command == "demo-model":
        if args.vlm:
            from autotune.demo_vlm import write_demo_vlm
            print(write_demo_vlm(args.dir, args.vlm, args.size))
            return 0
        if args.size != "tiny":
            raise UserError("--size needs --vlm")
        from autotune.demo_model import write_demo_model
        write_demo_model(args.dir)
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
