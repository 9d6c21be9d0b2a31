"""`autotune run`: from command-line words to a validated study, then the loop.

Everything that can be wrong with the input is checked here, before the database is touched or any
engine is launched: a typo costs a one-line error, not a half-written study or a minute of GPU time.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.bench.workloads import Workload, parse_workload
from autotune.node.pool import GpuPool, parse_gpus
from autotune.engine.base import Engine
from autotune.errors import UserError
from autotune.slo import check_slo_classes
from autotune.space import SearchSpace, flag_names, mapping_to_flags
from autotune.space.multimodal import MultimodalContext, with_multimodal
from autotune.spec import (StudySpec, build_spec, check_engine_command, check_model, load_spec_file,
                           parse_duration, resolve_provenance)
from autotune.store.repository import ResultStore, storage_exists
from autotune.store.urls import mask_url
from autotune.telemetry import auto_source, get_source
from autotune.telemetry.base import TelemetrySource
from autotune.tuner.host import catalog_gpu_name, nvml_gpus

if TYPE_CHECKING:
    from autotune.perfmodel.vision import VisionProfile

DEFAULT_TRIALS = 30
CPU_DEFAULTS: dict[str, Any] = {
    "search_space": "cpu",
    "workload": {"kind": "random", "input_len": 128, "output_len": 64},
    "load": {"mode": "capacity", "search": "concurrency", "max_steps": 5, "requests_per_step": 48, "warmup": 4},
    # vLLM's default memory fraction (0.92 of the NUMA node) cannot be had beside other processes,
    # so every trial, the baseline included, gets a fixed 0.3
    "engine": {"extra_flags": ["--dtype", "bfloat16", "--max-model-len", "1024", "--gpu-memory-utilization", "0.3"]},
}


def _model_name(model: str) -> str:
    stem = Path(model.rstrip("/")).name or "model"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stem)[:100]


def raw_spec(args: argparse.Namespace) -> tuple[dict[str, Any], Path | None]:
    if args.study:
        return load_spec_file(args.study), Path(args.study).resolve().parent
    if Path("autotune.yaml").is_file():
        return load_spec_file("autotune.yaml"), Path.cwd()
    if not args.model:
        raise UserError("nothing to tune: give --study FILE or --model MODEL (or write one with 'autotune init')")
    raw: dict[str, Any] = {"name": f"tune-{_model_name(args.model)}", "model": args.model}
    gpus = nvml_gpus()
    if gpus:
        raw["gpus"] = [g["index"] for g in gpus]
    else:
        raw.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in CPU_DEFAULTS.items()})
    return raw, None


def apply_overrides(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    raw = dict(raw)
    if args.study_name:
        raw["name"] = args.study_name
    if args.model:
        raw["model"] = args.model
    if args.slo:
        raw["slo"] = args.slo
    if args.storage:
        raw["storage"] = args.storage
    if args.gpus:
        raw["gpus"] = parse_gpus(args.gpus)
    engine = dict(raw.get("engine") or {})
    if args.engine_cmd:
        try:
            engine["command"] = shlex.split(args.engine_cmd)
        except ValueError as e:
            raise UserError(f"--engine-cmd: {e}") from None
        if not engine["command"]:
            raise UserError("--engine-cmd is empty")
    if engine:
        raw["engine"] = engine
    budget = dict(raw.get("budget") or {})
    if args.n_trials is not None:
        if args.n_trials < 1:
            raise UserError("--n-trials must be at least 1")
        budget["n_trials"] = args.n_trials
    if args.timeout is not None:
        budget["timeout"] = args.timeout
    if budget:
        raw["budget"] = budget
    if getattr(args, "no_confirm", False):
        raw["confirm"] = {**(raw.get("confirm") or {}), "enabled": False}
    return raw


def build_engine(spec: StudySpec, command: list[str]) -> Engine:
    if spec.engine.kind == "sim":
        from autotune.engine.sim import SimEngine
        if not spec.engine.gpu:
            raise UserError("engine sim needs engine.gpu (e.g. H100)")
        return SimEngine(spec.engine.gpu, spec.engine.num_gpus, time_scale=spec.engine.time_scale, seed=spec.seed)
    from autotune.engine.vllm import VLLMEngine
    return VLLMEngine(command)


def telemetry_for(spec: StudySpec) -> TelemetrySource:
    if spec.telemetry.source == "auto":
        return auto_source(spec.engine.kind, spec.gpus)
    return get_source(spec.telemetry.source)


def check_objectives(spec: StudySpec, source: TelemetrySource) -> None:
    if "tokens_per_joule" in spec.objectives and source.name not in ("nvml", "sim"):
        raise UserError(f"objective tokens_per_joule needs energy readings (telemetry nvml or sim), "
                        f"not {source.name!r}")
    if "mem_headroom" in spec.objectives and source.name == "none":
        raise UserError("objective mem_headroom needs telemetry (nvml, cpu or sim)")
    if "capacity_tps" in spec.objectives and spec.load.mode != "capacity":
        raise UserError("objective capacity_tps needs load.mode: capacity")


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    raw, base_dir = raw_spec(args)
    return prepare_spec(apply_overrides(raw, args), args.study or "spec", base_dir)


def prepare_spec(raw: dict[str, Any], source: str, base_dir: Path | None) -> dict[str, Any]:
    """Everything a study needs, checked before anything is written or launched (`run`, and the daemon
    for each queued study)."""
    spec = build_spec(raw, source)
    spec = resolve_provenance(check_model(spec, base_dir))
    command = check_engine_command(spec)
    workload = _checked_workload(spec)
    space = SearchSpace.load(spec.search_space, base_dir)
    vision = _vision(spec)
    if vision is not None:
        space = with_multimodal(space, vision)
    space = space.narrowed(spec.num_gpus, spec.quality_opt_in, spec.opt_ins())
    space.model_max_len = _model_max_len(spec)
    if vision is not None:
        space.multimodal = MultimodalContext(vision, workload.max_images)
    if spec.baseline:
        unknown = [k for k in spec.baseline if not re.fullmatch(r"[a-z][a-z0-9_]*", str(k))]
        if unknown:
            raise UserError(f"baseline: {unknown[0]!r} is not a flag name like gpu_memory_utilization")
    clash = sorted(set(space.env_names()) & set(spec.engine.env))
    if clash:
        raise UserError(f"engine.env sets {clash[0]}, which the search space searches (an env knob); "
                        "remove one of them")
    inherited = sorted(n for n in space.env_names() if n in os.environ)
    if inherited:   # the server inherits autotune's environment: an env knob's "unset" would not be unset
        raise UserError(f"{inherited[0]} is set in this environment and searched as an env knob; unset it here")
    source = telemetry_for(spec)
    check_objectives(spec, source)
    timeout_s = parse_duration(spec.budget.timeout) if spec.budget.timeout is not None else None
    n_trials = spec.budget.n_trials or DEFAULT_TRIALS
    engine = build_engine(spec, command)
    fixed = [*spec.engine.extra_flags, *space.fixed_flags]
    # Fixed and baseline flags are the user's own: one this engine lacks is an error. A knob of the space
    # the engine lacks (an older vLLM) is dropped with a notice and never sent.
    unknown = engine.unknown_flags(flag_names([*fixed, *mapping_to_flags(spec.baseline or {})]))
    if unknown:
        raise UserError(f"the engine does not know flag(s) {', '.join(unknown)} (checked against its --help)")
    space, notices = space.supported(engine.unknown_flags)
    space, more = space.launchable(fixed)
    notices += more
    if not space.params:
        raise UserError("the search space has nothing left to tune on this host")
    for i, cand in enumerate(spec.enqueue):
        for k, v in cand.items():
            if k not in space.params:
                raise UserError(f"enqueue[{i}]: {k!r} is not a parameter of the search space")
            if not space.params[k].contains(v):
                raise UserError(f"enqueue[{i}]: {k}={v!r} is outside the search space")
        off = space.inactive(cand)
        if off:
            raise UserError(f"enqueue[{i}]: {off[0]}")
    if storage_exists(spec.storage_url):
        existing = ResultStore(spec.storage_url, create=False).study(spec.name)
        if existing is not None and existing.space_hash != space.fingerprint():
            raise UserError(f"study {spec.name!r} in {spec.storage_url} was created with another search space; "
                            f"use a new study name or storage")
    return dict(spec=spec, space=space, engine=engine, telemetry=source, n_trials=n_trials, timeout_s=timeout_s,
                fixed_flags=fixed, engine_command=command, predict=_predictor(spec), notices=notices)


def _checked_workload(spec: StudySpec) -> Workload:
    """The study's workload, parsed (a trace is read) and checked against the endpoint and the SLO's
    classes: images travel only to the chat endpoint, and a term on a class needs requests of it."""
    workload = parse_workload(spec.workload)
    if workload.max_images and spec.load.endpoint != "chat":
        raise UserError(f"workload {workload.kind} sends images, which go to the chat endpoint: set load.endpoint: chat")
    check_slo_classes(spec.slo_obj, workload)
    return workload


def _vision(spec: StudySpec) -> "VisionProfile | None":
    """The model's vision encoder (a VLM of a modelled family), from its directory or its simulator profile."""
    from autotune.perfmodel.profiles import find_profile
    from autotune.perfmodel.vision import load_vision

    if spec.engine.kind == "sim":
        profile = find_profile(spec.model)
        return profile.vision if profile is not None else None
    return load_vision(spec.model) if Path(spec.model).is_dir() else None


def _model_max_len(spec: StudySpec) -> int | None:
    """What vLLM will take as the maximum length when no flag fixes it: the model directory's config.json,
    or for the simulator the profile it serves."""
    from autotune.space.model_len import model_max_len

    if spec.engine.kind == "sim":
        from autotune.perfmodel.profiles import find_profile
        profile = find_profile(spec.model)
        return profile.max_position if profile is not None else None
    return model_max_len(spec.model)


def _predictor(spec: StudySpec) -> Any:
    """The free feasibility prior: the memory model, when it knows the model and the GPU."""
    from autotune.perfmodel import predict_launch

    if spec.engine.kind == "sim":
        gpu, num = spec.engine.gpu, spec.engine.num_gpus
    else:
        gpus = [g for g in nvml_gpus() if g["index"] in spec.gpus]
        if not gpus:
            return None
        gpu, num = catalog_gpu_name(gpus[0]["name"]), len(gpus)
    return lambda flags: predict_launch(spec.model, flags, gpu, num)


def host_pool(spec: StudySpec, parallel: int) -> GpuPool:
    """The slots `run` leases from: the study's GPUs where NVML sees GPUs and the engine is real;
    otherwise virtual slots (the --gpus given, else one per parallel trial) that bound how many servers
    run at once and split the cores, with no CUDA_VISIBLE_DEVICES."""
    nvml = nvml_gpus() if spec.engine.kind != "sim" else []
    if nvml:
        return GpuPool.for_host(spec.gpus or [g["index"] for g in nvml], physical=True)
    return GpuPool.for_host(spec.gpus or list(range(parallel)), physical=False)


def run_command(args: argparse.Namespace) -> int:
    started = time.monotonic()
    parallel = getattr(args, "parallel", 1) or 1
    if parallel < 1:
        raise UserError("--parallel must be at least 1")
    report = getattr(args, "report", None)
    if report and not Path(report).resolve().parent.is_dir():
        raise UserError(f"--report {report}: folder {Path(report).parent} does not exist")
    return run_prepared(prepare(args), no_progress=args.no_progress, started=started, parallel=parallel,
                        report=report)


def run_prepared(parts: dict[str, Any], *, no_progress: bool, started: float, parallel: int = 1,
                 report: str | None = None) -> int:
    """The study `prepare_spec` checked, run (or resumed) to its end: `run`, and `ablate` for the study
    it derives."""
    from autotune.node.scheduler import Scheduler
    from autotune.tuner.after_budget import register as register_after_budget
    from autotune.tuner.driver import StudyDriver

    spec: StudySpec = parts["spec"]
    driver = StudyDriver(**parts, live=False if no_progress else None, started=started)
    register_after_budget(driver)   # the confirmation (when enabled): a job of the scheduler
    scheduler = Scheduler(host_pool(spec, parallel), parallel=parallel)
    scheduler.add(driver)
    scheduler.run_until_done()
    result = driver.result()
    if report:
        from autotune.report.html import write_report
        print(f"report: {write_report(spec.storage_url, spec.name, report)}")
    msg = (f"study {spec.name}: {result.complete} complete trial(s), {result.feasible} feasible; "
           f"storage {mask_url(spec.storage_url)}")
    if result.stopped_by:
        msg += f"; stopped by {result.stopped_by} (run the same command to resume)"
    print(msg)
    if result.stopped_by in ("SIGINT", "SIGTERM"):
        return 130 if result.stopped_by == "SIGINT" else 143
    return 0
