"""`export --format docker`: one `docker run` line for the trial, pinned to the vLLM version it ran.

The line is built as an argument list and quoted with `shlex.join`, so that a shell splits it back into
exactly that list whatever the model path holds. The layout (tensor x pipeline x data parallel) sets how
many GPUs the container gets; the model directory is mounted read-only.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from autotune.errors import UserError
from autotune.export.formats import knob_env, quality_warning
from autotune.export.options import ExportContext
from autotune.flags import flags_to_mapping
from autotune.report.provenance import provenance_lines

IMAGE_REPO = "vllm/vllm-openai"
PORT = 8000
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
_IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")


def image_for(ctx: ExportContext) -> str:
    """The user's image, or vLLM's official one tagged with the version the trial ran."""
    if ctx.image:
        if not _IMAGE_RE.fullmatch(ctx.image):
            raise UserError(f"--image {ctx.image!r} is not an image reference like vllm/vllm-openai:v0.24.0")
        return ctx.image
    m = re.match(r"\d+\.\d+(\.\d+)?", ctx.trial.engine_version or "")
    if m is None:
        raise UserError(f"trial {ctx.trial.number} has no recorded vLLM version "
                        f"({ctx.trial.engine_version or 'none'}): give --image")
    return f"{IMAGE_REPO}:v{m.group(0)}"


def flags(ctx: ExportContext) -> list[str]:
    return [*ctx.study.fixed_flags, *ctx.trial.flags]


def gpu_count(ctx: ExportContext) -> int:
    """GPUs the layout needs: tensor x pipeline x data parallel sizes (1 each when not set)."""
    m = flags_to_mapping(flags(ctx))
    n = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        try:
            n *= int(m.get(key, 1))
        except (TypeError, ValueError):
            raise UserError(f"--{key.replace('_', '-')} {m.get(key)!r} is not a whole number") from None
    return n


@dataclass(frozen=True)
class ModelMount:
    host: str              # a host directory to mount
    container: str         # where it is mounted
    model_arg: str         # what --model says inside the container
    read_only: bool


def model_mount(model: str) -> ModelMount:
    """A local model directory is mounted read-only at /models/NAME; a hub id is fetched into the
    mounted Hugging Face cache of the user who exports."""
    if model.startswith(("/", "./", "../", "~")):
        host = os.path.abspath(os.path.expanduser(model))
        inside = str(PurePosixPath("/models") / (PurePosixPath(host).name or "model"))
        return ModelMount(host, inside, inside, True)
    return ModelMount(os.path.expanduser("~/.cache/huggingface"), HF_CACHE_IN_CONTAINER, model, False)


def server_args(ctx: ExportContext, mount: ModelMount) -> list[str]:
    """vLLM's arguments inside a container: the model, the port, the trial's flags."""
    return ["--model", mount.model_arg, "--port", str(PORT), *flags(ctx)]


def docker_argv(ctx: ExportContext) -> list[str]:
    mount = model_mount(ctx.study.model)
    volume = f"{mount.host}:{mount.container}" + (":ro" if mount.read_only else "")
    env = [item for k, v in knob_env(ctx.trial).items() for item in ("-e", f"{k}={v}")]
    return ["docker", "run", "--rm", "--gpus", str(gpu_count(ctx)), "--ipc=host", "-p", f"{PORT}:{PORT}", "-v", volume,
            *env, image_for(ctx), *server_args(ctx, mount)]


def header(ctx: ExportContext, what: str) -> list[str]:
    t = ctx.trial
    lines = [f"# autotune: study {ctx.study.name}, trial {t.number} ({t.role}) as {what}; SLO {ctx.study.slo}",
             f"# measured: " + (", ".join(f"{k}={v:.4g}" for k, v in (t.objectives or {}).items()) or "-")
             + (" (SIMULATED: run on autotune's simulator, not on vLLM)" if t.simulated else ""),
             f"# verdict against the defaults: {ctx.verdict()}",
             f"# GPUs from the layout: {gpu_count(ctx)}; vLLM version the trial ran: {t.engine_version or 'unknown'}"]
    if not t.simulated and not (t.hardware or {}).get("gpus") and ctx.study.engine_kind == "vllm":
        lines.append("# NOTE: the trial ran on vLLM's CPU build; these figures say nothing about a GPU")
    quality = ctx.quality()
    if quality:
        lines.append(f"# {quality_warning(quality)}")
    lines += [f"# {line}" for line in provenance_lines(ctx.study, t)]
    env = knob_env(t)
    if env:
        lines.append("# environment set by the trial's env knobs: " + " ".join(f"{k}={v}" for k, v in env.items()))
    return lines


def docker_line(ctx: ExportContext) -> str:
    return "\n".join(header(ctx, "a docker run line")) + "\n" + shlex.join(docker_argv(ctx)) + "\n"
