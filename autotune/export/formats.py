"""Deployable forms of one trial's config. The vLLM YAML is what `vllm serve --config FILE` reads: keys
are flag names without `--`, and a boolean that was off is written `no-FLAG: true` so the file runs
exactly what the trial ran, whatever vLLM's defaults become. Environment variables the trial's env knobs
set are not flags: the YAML carries them as an `export` block in its comments (vLLM reads them from the
environment, not from the file), the command as a prefix, the JSON as `env`."""

from __future__ import annotations

import json
import shlex
from typing import Any, Mapping, Sequence

import yaml

from autotune.flags import flags_to_mapping, parallel_size
from autotune.pdlayout import KV_TRANSFER_FLAG, PDLayout, split_pd_flags
from autotune.redact import REDACTED, SECRET_FLAGS
from autotune.report.provenance import provenance_lines
from autotune.store.models import StudyRecord, TrialRecord
from autotune.tuner.verdict import flags_of


def quality_warning(quality: Mapping[str, Any]) -> str:
    """The line every export of a configuration that changes output quality carries (no comment marker);
    `quality` is tuner/verdict.quality_changes: the knobs set to other than the baseline ran."""
    knobs = ", ".join(f"{k}={v}" for k, v in quality.items())
    return (f"WARNING: changes output quality: {knobs} (quality knobs the study opted into) - validate accuracy "
            "before deploying; `autotune export --output-preserving` writes the best configuration that does not")


def _withheld(study: StudyRecord, trial: TrialRecord) -> list[str]:
    """Secret flags the study used: never stored, so an export leaves them to the deployer."""
    flags = [str(f).split("=", 1)[0] for f in [*study.fixed_flags, *trial.flags]]
    return [f for f in SECRET_FLAGS if f in flags]


def _secret_note(study: StudyRecord, trial: TrialRecord) -> str:
    withheld = _withheld(study, trial)
    if not withheld:
        return ""
    return (f"# secrets are never stored: {', '.join(withheld)} left out; give them yourself "
            "(--api-key: the VLLM_API_KEY environment variable)\n")


def knob_env(trial: TrialRecord) -> dict[str, str]:
    """What the trial's env knobs set at launch (never the study's engine.env, which may hold secrets)."""
    return {str(k): str(v) for k, v in (trial.env or {}).items()}


def env_comment(trial: TrialRecord) -> list[str]:
    """The trial's environment as lines a `vllm serve --config` user applies before starting the server."""
    env = knob_env(trial)
    if not env:
        return []
    return ["# environment: vLLM reads these from the environment, not from this file; set them where the "
            "server starts:", *[f"#   export {k}={shlex.quote(v)}" for k, v in env.items()]]


def config_mapping(study: StudyRecord, trial: TrialRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"model": study.model}
    for name, value in flags_to_mapping([*study.fixed_flags, *trial.flags]).items():
        key = name.replace("_", "-")
        if "--" + key in SECRET_FLAGS or value == REDACTED:
            continue
        if value is False:
            out["no-" + key] = True
        else:
            out[key] = _scalar(value)
    return out


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        for cast in (int, float):
            try:
                return cast(value)
            except ValueError:
                pass
    return value


def vllm_yaml(study: StudyRecord, trial: TrialRecord, verdict: Sequence[str] = (),
              quality: Mapping[str, Any] | None = None) -> str:
    """`verdict`: the confirmation and gain lines (report/confirmed.py's export_header), as comments;
    `quality`: the quality knobs the trial changes (tuner/verdict.quality_changes)."""
    head = [f"# autotune: study {study.name}, trial {trial.number} ({trial.role}), SLO {study.slo}"]
    objectives = ", ".join(f"{k}={v:.4g}" for k, v in (trial.objectives or {}).items())
    if objectives:
        head.append(f"# measured (first run): {objectives}" + (" (SIMULATED)" if trial.simulated else ""))
    head += [f"# {line}" for line in verdict]
    if quality:
        head.append(f"# {quality_warning(quality)}")
    head += [f"# {line}" for line in provenance_lines(study, trial)]
    head += env_comment(trial)
    head.append(f"# run: vllm serve --config THIS_FILE   (engine {trial.engine_version or 'unknown version'})")
    return "\n".join(head) + "\n" + _secret_note(study, trial) + yaml.safe_dump(config_mapping(study, trial), sort_keys=False)


def serve_command(study: StudyRecord, trial: TrialRecord, verdict: Sequence[str] = (),
                  quality: Mapping[str, Any] | None = None) -> str:
    cmd = list(study.engine_command) if study.engine_kind == "vllm" else ["vllm", "serve"]
    if cmd[-1] == "serve":
        cmd.append(study.model)
    else:
        cmd += ["--model", study.model]
    layout, flags = split_pd_flags(_without_secrets([*study.fixed_flags, *trial.flags]))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in knob_env(trial).items())
    if layout is None:
        text = " ".join([*([env] if env else []), *(shlex.quote(c) for c in [*cmd, *flags])])
    else:
        text = pd_commands(layout, [*cmd, *flags], env)
    note = f"# {quality_warning(quality)}\n" if quality else ""
    note += "".join(f"# {line}\n" for line in provenance_lines(study, trial))
    return "".join(f"# {line}\n" for line in verdict) + note + _secret_note(study, trial) + text + "\n"


def pd_commands(layout: PDLayout, cmd: list[str], env: str, first_gpu: int = 0, port: int = 8000) -> str:
    """A PD split as the shell lines that start it on one host, as autotune launched it: each instance on
    its own GPUs and ports with the KV connector's config, then the router in front (engine/deployment.py).
    GPU indices and ports are examples (the trial's came from its lease)."""
    per = parallel_size(flags_to_mapping(cmd))
    roles = [("prefill", i) for i in range(layout.prefill)] + [("decode", i) for i in range(layout.decode)]
    lines = [f"# prefill/decode split {layout.label}: {layout.instances} instances of {per} GPU(s), then the "
             "router (autotune router; vLLM's disaggregated proxy speaks the same protocol)"]
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    for k, (role, i) in enumerate(roles):
        gpus = ",".join(str(first_gpu + k * per + j) for j in range(per))
        inst_port = port + 100 * (1 if role == "prefill" else 2) + i
        urls[role].append(f"http://127.0.0.1:{inst_port}")
        argv = [*cmd, "--port", str(inst_port), KV_TRANSFER_FLAG, layout.kv_transfer_config()]
        lines.append(" ".join([f"CUDA_VISIBLE_DEVICES={gpus}", f"VLLM_NIXL_SIDE_CHANNEL_PORT={5600 + k * per}",
                               *([env] if env else []), *(shlex.quote(c) for c in argv), "&"]))
    lines.append(" ".join(["autotune", "router", "--port", str(port), "--prefill", *urls["prefill"],
                           "--decode", *urls["decode"]]))
    return "\n".join(lines)


def _without_secrets(flags: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for flag in (str(f) for f in flags):
        if skip and not flag.startswith("--"):
            skip = False
            continue
        skip = False
        if flag.split("=", 1)[0] in SECRET_FLAGS:
            skip = "=" not in flag
            continue
        out.append(flag)
    return out


def as_json(study: StudyRecord, trial: TrialRecord, verdict: Sequence[str] = (),
            quality: Mapping[str, Any] | None = None) -> str:
    return json.dumps({
        "study": study.name, "trial": trial.number, "role": trial.role, "model": study.model,
        "slo": study.slo, "objectives": trial.objectives, "constraints": trial.constraints,
        "params": trial.params, "flags": _without_secrets([*study.fixed_flags, *trial.flags]),
        "env": knob_env(trial), "labels": provenance_lines(study, trial),
        "withheld_secret_flags": _withheld(study, trial), "config": config_mapping(study, trial),
        "quality_changes": dict(quality or {}), "metrics": trial.metrics, "capacity": trial.capacity,
        "telemetry": trial.telemetry, "kv_cache_tokens": trial.kv_cache_tokens,
        "engine_version": trial.engine_version, "hardware": trial.hardware, "workload": trial.workload,
        "simulated": trial.simulated, "spec_hash": trial.spec_hash,
        "measurement_flags": flags_of(trial), "verdict": list(verdict),
    }, indent=2, default=str) + "\n"


FORMATS = {"vllm-yaml": vllm_yaml, "command": serve_command, "json": as_json}
