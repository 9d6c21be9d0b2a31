"""What a figure was measured on, where that decides what it means.

Speculative decoding preserves the output distribution, but its gain is the share of draft tokens the
model accepts, and that depends on how predictable the real text is: a random-weight model emits noise
and synthetic prompts are token runs, so a gain (or loss) measured there says nothing about a deployment.
`show`, the report and every export header carry this label for a trial that ran speculative decoding.
"""

from __future__ import annotations

from typing import Any

from autotune.flags import flags_to_mapping
from autotune.store.models import StudyRecord, TrialRecord

SPECULATIVE_FLAG = "--speculative-config"


def speculative_used(trial: TrialRecord) -> bool:
    return any(str(f).split("=", 1)[0] == SPECULATIVE_FLAG for f in trial.flags or [])


def measured_on(study: StudyRecord) -> list[str]:
    """Why this study's text is not real text: "random weights", "synthetic prompts" (empty: real)."""
    spec = study.spec or {}
    sp = spec.get("speculative") or {}
    out = []
    if sp.get("random_weights"):
        out.append("random weights")
    synthetic = sp.get("synthetic_prompts")
    if synthetic is None:
        synthetic = (spec.get("workload") or {}).get("kind") in ("random", "prefix")
    if synthetic:
        out.append("synthetic prompts")
    return out


def speculative_label(study: StudyRecord) -> str | None:
    """The one-line label for speculative-decoding figures of this study, or None when the model and
    prompts are real."""
    on = measured_on(study)
    if not on:
        return None
    return (f"SPECULATIVE DECODING measured on {' and '.join(on)}: its acceptance rate and any gain or loss "
            "from it say nothing about real text; measure it on your model and traffic")


def provenance_lines(study: StudyRecord, trial: TrialRecord) -> list[str]:
    """Header lines for an export of `trial` (empty unless it ran speculative decoding)."""
    if not speculative_used(trial):
        return []
    method = flags_to_mapping(list(trial.flags or [])).get("speculative_config")
    lines = [f"speculative decoding: {method}" + (f"; {acceptance(trial)}" if acceptance(trial) else "")]
    label = speculative_label(study)
    return lines + ([label] if label else [])


def acceptance(trial: TrialRecord | Any) -> str:
    """`41.2 % of draft tokens accepted (1.65 per draft)` from the trial's figures at its capacity, or ""."""
    m = trial.metrics or {}
    pct = m.get("spec_acceptance_pct")
    if pct is None:
        return ""
    per = m.get("spec_mean_accepted")
    return f"{pct:.1f} % of draft tokens accepted" + (f" ({per:.2f} per draft)" if per is not None else "")
