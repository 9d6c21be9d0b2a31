"""`autotune sim-serve` and `autotune estimate`: autotune's own options first, then vLLM's flags
(a `--` between them is accepted). An unknown flag is an argparse error and exit 2, as in vLLM."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Sequence

from autotune.errors import UserError
from autotune.perfmodel.config import add_vllm_arguments, expand_config_file, resolve
from autotune.perfmodel.gpus import get_gpu, gpu_names
from autotune.perfmodel.memory import memory_budget
from autotune.perfmodel.predict import Plan
from autotune.perfmodel.profiles import builtin_names, load_profile

if TYPE_CHECKING:
    from autotune.sim.inprocess import ImageMix


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _own_options(p: argparse.ArgumentParser, serve: bool) -> None:
    g = p.add_argument_group("simulator")
    g.add_argument("--gpu", required=True, help=f"GPU catalog name: {', '.join(gpu_names())}")
    g.add_argument("--num-gpus", type=int, default=1, help="GPUs on the simulated host")
    g.add_argument("--model-profile", help=f"built-in ({', '.join(builtin_names())}) or a HF config.json path")
    if serve:
        g.add_argument("--host", default="127.0.0.1")
        g.add_argument("--port", type=int, default=8000)
        g.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per wall second")
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--noise", type=float, default=0.0, help="lognormal sigma on step times (0: exact)")
        g.add_argument("--max-events-per-s", type=float, default=3000.0,
                       help="SSE events per wall second before tokens are coalesced into chunks")
        g.add_argument("--startup-wall-max", type=float, default=3.0,
                       help="cap on the wall seconds spent 'starting' (simulated startup / time scale)")
    else:
        g.add_argument("--json", action="store_true", help="one JSON object on stdout")
        g.add_argument("--input-len", type=int, default=1024)
        g.add_argument("--output-len", type=int, default=256)
        g.add_argument("--no-curve", action="store_true", help="skip the simulated throughput-latency curve")
        g.add_argument("--pd", action="append", default=[], metavar="SPLIT",
                       help="also predict a prefill/decode split, e.g. 1p1d, 2p1d or 1p2d (repeatable)")
        g.add_argument("--image-size", help="a VLM: requests carry images of WIDTHxHEIGHT (e.g. 1024x768)")
        g.add_argument("--images", type=int, default=1, help="images per image request (with --image-size)")
        g.add_argument("--image-share", type=float, default=1.0,
                       help="share of requests that carry images (with --image-size)")


def build_parser(serve: bool) -> argparse.ArgumentParser:
    p = _Parser(prog="autotune sim-serve" if serve else "autotune estimate", allow_abbrev=False,
                description="SIMULATED vLLM server (no GPU)" if serve else "Memory budget and roofline estimate")
    _own_options(p, serve)
    add_vllm_arguments(p)
    return p


def _parse(argv: Sequence[str], serve: bool) -> tuple[argparse.Namespace, Plan, str]:
    args = [a for a in argv if a != "--"]
    p = build_parser(serve)
    ns = p.parse_args(expand_config_file(args))
    model = ns.model_profile or ns.model or ns.model_tag
    if not model:
        p.error("--model-profile is required")
    if ns.num_gpus < 1:
        p.error(f"argument --num-gpus: must be >= 1, got {ns.num_gpus}")
    profile = load_profile(model)
    gpu = get_gpu(ns.gpu)
    cfg = resolve(ns, profile, gpu)
    return ns, Plan(profile, gpu, ns.num_gpus, cfg, memory_budget(profile, cfg, gpu, ns.num_gpus)), model


def _non_default(ns: argparse.Namespace, argv: Sequence[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in argv:
        if a.startswith("--") and a != "--":
            key = a[2:].split("=", 1)[0].replace("-", "_")
            if hasattr(ns, key) and key not in ("gpu", "num_gpus", "model_profile", "time_scale", "port", "host"):
                out[key] = getattr(ns, key)
    return out


# ---- sim-serve -----------------------------------------------------------------------------------
def serve_main(argv: list[str]) -> int:
    from autotune.sim.startup import log_banner, log_failure, log_ready, setup_logging, startup_times

    try:
        ns, plan, model = _parse(argv, serve=True)
    except UserError as e:
        sys.stderr.write(f"autotune sim-serve: error: {e}\n")
        return 2
    if ns.time_scale <= 0:
        sys.stderr.write("autotune sim-serve: error: argument --time-scale: must be > 0\n")
        return 2
    log = setup_logging()
    name = (ns.served_model_name or [model])[0]
    log_banner(log, plan, model, _non_default(ns, argv))
    times = startup_times(plan)
    if not plan.budget.fits:
        time.sleep(min(times.load_s / ns.time_scale, ns.startup_wall_max))
        log_failure(log, plan.budget.reason)
        return 1
    time.sleep(min(times.total_s / ns.time_scale, ns.startup_wall_max))
    log_ready(log, plan, times)
    return asyncio.run(_serve(ns, plan, name, log))


async def _serve(ns: argparse.Namespace, plan: Plan, name: str, log: object) -> int:
    from aiohttp import web

    from autotune.sim.server import SimServer

    server = SimServer(plan, name, ns.time_scale, ns.seed, ns.noise, ns.max_events_per_s,
                       kv_transfer=ns.kv_transfer_config, engine_id=f"sim-{ns.port}")
    # shutdown_timeout: requests still waiting in the (now stopped) scheduler would hold a graceful
    # shutdown for aiohttp's default 60 s; a stopped server should be gone in a moment, as when the
    # tuner that started it dies (its parent-death SIGTERM) and nobody follows up with SIGKILL
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, ns.host, ns.port)
    try:
        await site.start()
    except OSError as e:
        log.error("[Errno 98] could not bind %s:%d: %s", ns.host, ns.port, e)  # type: ignore[attr-defined]
        await runner.cleanup()
        return 1
    server.start()
    log.info("Starting vLLM server on http://%s:%d", ns.host, ns.port)  # type: ignore[attr-defined]
    log.info("Application startup complete. (simulated, time scale %g)", ns.time_scale)  # type: ignore[attr-defined]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.ensure_future(stop.wait())
    assert server.task is not None
    await asyncio.wait({waiter, server.task}, return_when=asyncio.FIRST_COMPLETED)
    code = 1 if server.died else 0
    if not server.died:
        log.info("Shutting down (simulated engine).")  # type: ignore[attr-defined]
        server.task.cancel()
    waiter.cancel()
    await runner.cleanup()
    return code


# ---- estimate -------------------------------------------------------------------------------------
def _image_mix(ns: argparse.Namespace, plan: Plan) -> "ImageMix | None":
    from autotune.bench.images import parse_size
    from autotune.sim.inprocess import ImageMix

    if ns.image_size is None:
        return None
    if plan.profile.vision is None:
        raise UserError(f"--image-size: {plan.profile.name} has no vision encoder modelled (a text model, or a "
                        "VLM family not modelled: qwen2_vl, idefics3 are)")
    if ns.images < 1 or not 0 < ns.image_share <= 1:
        raise UserError("--images must be >= 1 and --image-share in (0, 1]")
    return ImageMix(ns.image_share, (ns.images, ns.images), (parse_size(ns.image_size, "--image-size"),))



def estimate_main(argv: list[str]) -> int:
    from autotune.sim.estimate import estimate_report, render_text
    from autotune.sim.split import parse_layout

    try:
        ns, plan, _ = _parse(argv, serve=False)
    except UserError as e:
        sys.stderr.write(f"autotune estimate: error: {e}\n")
        return 2
    try:
        images = _image_mix(ns, plan)
        splits = [parse_layout(text) for text in ns.pd]
    except UserError as e:
        sys.stderr.write(f"autotune estimate: error: {e}\n")
        return 2
    report = estimate_report(plan, ns.input_len, ns.output_len, curve=not ns.no_curve, images=images, pd=splits)
    if ns.json:
        sys.stdout.write(json.dumps(report, indent=None) + "\n")
    else:
        sys.stdout.write(render_text(report))
    return 0
