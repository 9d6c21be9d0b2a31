"""Deployable forms of one trial's config. The vLLM YAML is what `vllm serve --config FILE` reads: keys
are flag names without `--`, and a boolean that was off is written `no-FLAG: true` so the file runs
exactly what the trial ran, whatever vLLM's defaults become."""

from __future__ import annotations

import json
import shlex
from typing import Any, Sequence

import yaml

from autotune.flags import flags_to_mapping
from autotune.store.models import StudyRecord, TrialRecord
from autotune.tuner.verdict import flags_of


def _quality_used(study: StudyRecord, trial: TrialRecord) -> list[str]:
    return [k for k in (study.quality_knobs or []) if k in (trial.params or {})]


def config_mapping(study: StudyRecord, trial: TrialRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"model": study.model}
    for name, value in flags_to_mapping([*study.fixed_flags, *trial.flags]).items():
        key = name.replace("_", "-")
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


def vllm_yaml(study: StudyRecord, trial: TrialRecord, verdict: Sequence[str] = ()) -> str:
    """`verdict`: the confirmation and gain lines (report/confirmed.py's export_header), as comments."""
    head = [f"# autotune: study {study.name}, trial {trial.number} ({trial.role}), SLO {study.slo}"]
    objectives = ", ".join(f"{k}={v:.4g}" for k, v in (trial.objectives or {}).items())
    if objectives:
        head.append(f"# measured (first run): {objectives}" + (" (SIMULATED)" if trial.simulated else ""))
    head += [f"# {line}" for line in verdict]
    quality = _quality_used(study, trial)
    if quality:
        head.append(f"# WARNING: changes output quality: {', '.join(quality)} - validate accuracy before deploying")
    head.append(f"# run: vllm serve --config THIS_FILE   (engine {trial.engine_version or 'unknown version'})")
    return "\n".join(head) + "\n" + yaml.safe_dump(config_mapping(study, trial), sort_keys=False)


def serve_command(study: StudyRecord, trial: TrialRecord, verdict: Sequence[str] = ()) -> str:
    cmd = list(study.engine_command) if study.engine_kind == "vllm" else ["vllm", "serve"]
    if cmd[-1] == "serve":
        cmd.append(study.model)
    else:
        cmd += ["--model", study.model]
    cmd += [*study.fixed_flags, *trial.flags]
    text = " ".join(shlex.quote(c) for c in cmd)
    quality = _quality_used(study, trial)
    note = f"# WARNING: changes output quality: {', '.join(quality)}\n" if quality else ""
    return "".join(f"# {line}\n" for line in verdict) + note + text + "\n"


def as_json(study: StudyRecord, trial: TrialRecord, verdict: Sequence[str] = ()) -> str:
    return json.dumps({
        "study": study.name, "trial": trial.number, "role": trial.role, "model": study.model,
        "slo": study.slo, "objectives": trial.objectives, "constraints": trial.constraints,
        "params": trial.params, "flags": [*study.fixed_flags, *trial.flags], "config": config_mapping(study, trial),
        "quality_knobs": _quality_used(study, trial), "metrics": trial.metrics, "capacity": trial.capacity,
        "telemetry": trial.telemetry, "kv_cache_tokens": trial.kv_cache_tokens,
        "engine_version": trial.engine_version, "hardware": trial.hardware, "workload": trial.workload,
        "simulated": trial.simulated, "spec_hash": trial.spec_hash,
        "measurement_flags": flags_of(trial), "verdict": list(verdict),
    }, indent=2, default=str) + "\n"


FORMATS = {"vllm-yaml": vllm_yaml, "command": serve_command, "json": as_json}
