"""`export --format deploy-kit -o DIR`: what a team writes by hand after tuning, derived from the trial.

    deploy.sh   start vLLM in the background with the trial's flags (PID file, log file, waits for /health)
    debug.sh    the same in the foreground
    stop.sh     stop it: its process group, then any descendant that left the group
    smoke.sh    health, models, one completion, then a short load at 80 % of the measured capacity
                (SMOKE_LOAD overrides) that must meet the study's SLO
    settings.sh the defaults (every one overridable by an environment variable named after it,
                MAX_NUM_SEQS=64, ENABLE_PREFIX_CACHING=0|1; an env knob by its own variable,
                VLLM_X=2) and the checks every value passes
    config.yaml the `vllm serve --config` file
    README.md   the measured numbers, the verdict, any quality warning
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from typing import Any

from autotune.errors import UserError
from autotune.export.container import header
from autotune.export.formats import knob_env, quality_warning, vllm_yaml
from autotune.export.kit_scripts import DEBUG, DEPLOY, LIBRARY, SMOKE, STOP
from autotune.export.options import ExportContext
from autotune.flags import flags_to_mapping
from autotune.report.provenance import provenance_lines
from autotune.spec import ENV_NOT_STORED

# names the kit itself uses (and the environment's own): a flag with one of these names gets FLAG_
RESERVED = {"MODEL", "HOST", "PORT", "RUN_DIR", "STARTUP_TIMEOUT", "STOP_TIMEOUT", "SMOKE_LOAD", "SMOKE_REQUESTS",
            "PYTHON", "DRY_RUN", "PATH", "HOME", "USER", "SHELL", "PWD", "IFS", "LANG", "TERM", "KIT_DIR", "CMD"}
SET_BY_KIT = {"model", "host", "port"}
_INT, _FLOAT = re.compile(r"[0-9]+"), re.compile(r"[0-9]+(\.[0-9]+)?")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def value_kind(value: Any) -> str:
    """The check an override of this flag must pass (the same one its default passes)."""
    if isinstance(value, bool):
        return "bool"
    text = str(value)
    for kind, rx in (("int", _INT), ("float", _FLOAT), ("word", _WORD)):
        if rx.fullmatch(text):
            return kind
    return "text"


def env_name(flag: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]", "_", flag).upper()
    return "FLAG_" + name if name in RESERVED or not _ENV_NAME.fullmatch(name) else name


def kit_flags(ctx: ExportContext) -> list[tuple[str, str, str, str]]:
    """(variable, kind, flag name, default) for every flag the trial ran with, fixed flags included."""
    out = []
    for name, value in flags_to_mapping([*ctx.study.fixed_flags, *ctx.trial.flags]).items():
        flag = name.replace("_", "-")
        if flag in SET_BY_KIT:
            continue
        kind = value_kind(value)
        default = ("1" if value else "0") if kind == "bool" else str(value)
        out.append((env_name(name), kind, flag, default))
    return out


def kit_env_knobs(ctx: ExportContext) -> list[tuple[str, str, str]]:
    """(variable, kind, default) for every environment variable the trial's env knobs set: overridden by
    the same variable in the deployer's environment, checked like a flag's value."""
    out = []
    for name, value in knob_env(ctx.trial).items():
        if name in RESERVED or not _ENV_NAME.fullmatch(name):
            raise UserError(f"env knob {name} collides with a name the deploy kit uses itself")
        kind = value_kind(value)
        out.append((name, "int" if kind == "bool" else kind, value))
    return out


def _engine_command(ctx: ExportContext) -> list[str]:
    cmd = ctx.engine_cmd or list(ctx.study.engine_command or [])
    if not cmd:
        raise UserError("the study records no engine command: give --engine-cmd 'vllm serve'")
    if any("{" in c and "}" in c for c in cmd):
        raise UserError("the study's engine command is a template (a container?): give --engine-cmd 'vllm serve'")
    return cmd


def _array(name: str, items: list[str]) -> str:
    return f"{name}=(" + " ".join(shlex.quote(i) for i in items) + ")"


def smoke_load(ctx: ExportContext) -> tuple[str, str, str, float | None]:
    """(bench flag, kind, default load, measured capacity): 80 % of the highest load that met the SLO."""
    cap = ctx.trial.capacity or {}
    mode = cap.get("mode") or ("rate" if (ctx.trial.metrics or {}).get("request_rate_offered") else "concurrency")
    measured = cap.get("capacity") or (ctx.trial.metrics or {}).get("concurrency")
    if mode == "rate":
        return "rate", "float", f"{max(0.01, 0.8 * float(measured or 1.0)):.3f}", measured
    return "concurrency", "int", str(max(1, math.floor(0.8 * float(measured or 1)))), measured


def workload_text(ctx: ExportContext) -> str:
    w = dict(ctx.trial.workload or (ctx.study.spec or {}).get("workload") or {"kind": "random"})
    kind = w.pop("kind", "random")
    return f"{kind}:" + ",".join(f"{k}={v}" for k, v in w.items() if v is not None)


def settings_sh(ctx: ExportContext) -> str:
    flags = kit_flags(ctx)
    knobs = kit_env_knobs(ctx)
    cmd = _engine_command(ctx)
    stored = {str(k): str(v) for k, v in (((ctx.study.spec or {}).get("engine") or {}).get("env") or {}).items()
              if _ENV_NAME.fullmatch(str(k))}
    env = {k: v for k, v in stored.items() if v != ENV_NOT_STORED}
    unstored = [k for k, v in stored.items() if v == ENV_NOT_STORED]   # the deployer's environment gives them
    load_flag, load_kind, load, capacity = smoke_load(ctx)
    n_requests = max(16, 3 * math.ceil(float(load)))
    q = shlex.quote
    lines = [
        f"# autotune deploy kit: study {ctx.study.name}, trial {ctx.trial.number}. Sourced by the scripts.",
        "# Every DEFAULT_X and flag default below is overridden by an environment variable X; every value",
        "# is checked against its kind (whole number, number, 0|1, word, text) before anything starts.",
        _array("ENGINE_CMD", cmd),
        f"MODEL_POSITIONAL={1 if cmd[-1] == 'serve' else 0}",
        f"DEFAULT_MODEL={q(ctx.study.model)}",
        "DEFAULT_HOST=0.0.0.0", "DEFAULT_PORT=8000", "DEFAULT_STARTUP_TIMEOUT=900", "DEFAULT_STOP_TIMEOUT=30",
        'DEFAULT_RUN_DIR="$KIT_DIR/run"',
        "",
        "# flag variable | kind | vLLM flag | default (the trial ran with these)",
        _array("FLAG_VARS", [f[0] for f in flags]), _array("FLAG_KINDS", [f[1] for f in flags]),
        _array("FLAG_NAMES", [f[2] for f in flags]), _array("FLAG_DEFAULTS", [f[3] for f in flags]),
        "",
        "# the study's engine environment",
        _array("ENV_VARS", list(env)), _array("ENV_DEFAULTS", list(env.values())),
        "# the study's engine environment whose values the study does not store (none is): set each here",
        _array("ENV_UNSTORED", unstored),
        "",
        "# environment variables the trial's env knobs set | kind | default (overridden like a flag)",
        _array("KNOB_ENV_VARS", [k[0] for k in knobs]), _array("KNOB_ENV_KINDS", [k[1] for k in knobs]),
        _array("KNOB_ENV_DEFAULTS", [k[2] for k in knobs]),
        "",
        "# smoke.sh",
        f"DEFAULT_SMOKE_SLO={q(ctx.study.slo)}", f"WORKLOAD={q(workload_text(ctx))}",
        f"LOAD_FLAG={load_flag}", f"LOAD_KIND={load_kind}", f"CAPACITY={q(str(capacity))}",
        f"DEFAULT_SMOKE_LOAD={q(load)}", f"DEFAULT_SMOKE_REQUESTS={n_requests}",
        f"DEFAULT_SMOKE_WARMUP={math.ceil(float(load))}",
        f"DEFAULT_PYTHON={q(sys.executable)}",
    ]
    return "\n".join(lines) + "\n" + LIBRARY


def readme(ctx: ExportContext) -> str:
    t = ctx.trial
    sim = " (SIMULATED)" if t.simulated else ""
    confirmed = ctx.confirmed()
    flags = ctx.measurement_flags()
    quality = ctx.quality()
    load_flag, _, load, capacity = smoke_load(ctx)
    m = t.metrics or {}
    rows = [("objectives (first run)" + sim, ", ".join(f"{k} = {v:.4g}" for k, v in (t.objectives or {}).items())),
            (f"highest {load_flag} meeting the SLO", str(capacity)),
            ("p99 TTFT / median TPOT at that load", f"{m.get('p99_ttft_ms', float('nan')):.4g} ms / "
                                                    f"{m.get('median_tpot_ms', float('nan')):.4g} ms"),
            ("output tokens/s at that load", f"{m.get('output_throughput', float('nan')):.4g}"),
            ("KV-cache tokens", str(t.kv_cache_tokens)), ("vLLM version", str(t.engine_version)),
            ("confirmed", "not confirmed" if confirmed is None else
             f"{len(confirmed.rows)} repeats: " + ", ".join(f"{n} median {confirmed.medians[n]:.4g}"
                                                          for n, _ in ctx.study.objectives if n in confirmed.medians)),
            ("verdict against the defaults", ctx.verdict()),
            ("measurement flags", ", ".join(flags) or "none recorded")]
    out = [f"# Deploy kit: study {ctx.study.name}, trial {t.number}{sim}", ""]
    if t.simulated:
        out += ["**SIMULATED**: these numbers come from autotune's simulator, not from vLLM on real hardware.", ""]
    if quality:
        out += [f"**{quality_warning(quality)}**", ""]
    out += [f"**{line}**" if line.startswith("SPECULATIVE") else line for line in provenance_lines(ctx.study, t)]
    out += [""] if provenance_lines(ctx.study, t) else []
    out += [f"Model `{ctx.study.model}`, SLO `{ctx.study.slo}`, workload `{workload_text(ctx)}`.", "",
            "| | |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows], "",
            "```sh", "./deploy.sh                 # start in the background, wait for /health",
            "./smoke.sh                  # health, models, one completion, "
            f"{load_flag} {load} (80 % of capacity) against the SLO",
            "./stop.sh                   # stop it and everything it started",
            "./debug.sh                  # the same server in the foreground",
            "MAX_NUM_SEQS=64 ./deploy.sh # any setting, from the environment (DRY_RUN=1 prints the command)",
            "```", "", "Settings (environment variable, vLLM flag, value the trial ran with):", "",
            *[f"- `{v}` -> `--{f}`: `{d}`" + (" (0 or 1)" if k == "bool" else "") for v, k, f, d in kit_flags(ctx)],
            *[f"- `{v}` (environment, set by an env knob): `{d}`" for v, _, d in kit_env_knobs(ctx)],
            "- `MODEL`, `HOST` (0.0.0.0), `PORT` (8000), `RUN_DIR` (./run: PID and log), `STARTUP_TIMEOUT`, "
            "`STOP_TIMEOUT`, `SMOKE_LOAD`, `SMOKE_REQUESTS`, `SMOKE_WARMUP`, `SMOKE_SLO` (the study's), "
            "`PYTHON` (the interpreter with autotune, for smoke.sh)",
            "", "`config.yaml` is the same configuration for `vllm serve --config config.yaml`.", ""]
    return "\n".join(out)


def kit_files(ctx: ExportContext) -> dict[str, tuple[str, int]]:
    note = "".join(line + "\n" for line in header(ctx, "a deploy kit"))
    scripts = {"deploy.sh": DEPLOY, "debug.sh": DEBUG, "stop.sh": STOP, "smoke.sh": SMOKE}
    return {"settings.sh": (settings_sh(ctx), 0o644),
            "config.yaml": (vllm_yaml(ctx.study, ctx.trial, quality=ctx.quality()), 0o644),
            "README.md": (readme(ctx), 0o644),
            **{name: (body.replace("set -euo pipefail\n", note + "set -euo pipefail\n", 1), 0o755)
               for name, body in scripts.items()}}
