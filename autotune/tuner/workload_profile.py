"""The study's workload, described once and stored with the study (bench/profile.py), so that `show`
says what traffic a study was tuned on: a trace's lengths, bursts and prefix sharing, or a sample of a
synthetic workload's prompts."""

from __future__ import annotations

from pathlib import Path

from autotune.bench.profile import describe
from autotune.bench.tokens import load_tokenizer
from autotune.bench.workloads import parse_workload
from autotune.spec import StudySpec
from autotune.store.repository import ResultStore


def store_workload_profile(store: ResultStore, study_id: int, spec: StudySpec) -> None:
    """Describe the spec's workload with the model's tokenizer (when local) and store it, unless the study
    already holds a profile (a resumed study keeps the one it started with)."""
    if store.workload_profile(study_id) is not None:
        return
    tok = load_tokenizer(None, spec.model) if Path(spec.model).is_dir() else None
    workload = parse_workload(spec.workload)
    store.save_workload_profile(study_id, {"workload": workload.params(), "sample": workload.one_pass_is_sample,
                                           **describe(workload.one_pass(tok), tok)})
