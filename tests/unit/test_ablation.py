"""`autotune ablate` (tuner/ablation.py): the study it derives from a trial, through a real SQLite store and
the real spec and space parsers. What it runs is the ordinary study loop and confirmation, tested
elsewhere; here, that the derived study holds exactly the baseline, the trial and one variant per knob,
that each variant launches the flags it names, and that every refusal is one line with exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main
from autotune.errors import UserError
from autotune.space import SearchSpace
from autotune.spec import build_spec
from autotune.store.repository import ResultStore
from autotune.tuner.ablation import build_ablation, differing

SPACE: dict[str, Any] = {
    "fixed": {"max-model-len": 4096},
    "params": {
        "max_num_seqs": {"type": "int", "low": 16, "high": 1024, "default": 256},
        "gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.95, "default": 0.9},
        "enable_chunked_prefill": {"type": "bool", "default": True},
        "long_prefill_token_threshold": {"type": "int", "low": 0, "high": 4096, "default": 0,
                                         "when": {"enable_chunked_prefill": [False]}},
        "stream_interval": {"type": "categorical", "choices": [1, 2, 4, 8], "default": 1},
        "max_cudagraph_capture_size": {"type": "categorical", "choices": ["none", 512, 1024], "default": "none"},
    },
}
BASE = {"max_num_seqs": 256, "gpu_memory_utilization": 0.9, "enable_chunked_prefill": True,
        "stream_interval": 1, "max_cudagraph_capture_size": "none"}


def _raw(storage: str) -> dict[str, Any]:
    return {"name": "dec", "model": "/models/m", "slo": "tpot:p99<=20ms", "objectives": ["capacity_tps"],
            "engine": {"kind": "vllm", "extra_flags": ["--dtype", "bfloat16"]}, "search_space": SPACE,
            "storage": storage, "budget": {"n_trials": 12}, "confirm": {"top_k": 2, "repeats": 5},
            "enqueue": [{"stream_interval": 8}], "warm_start": {"from": "twin", "k": 3}}


def _store(tmp_path: Path, trials: list[tuple[str, dict[str, Any]]]) -> tuple[str, ResultStore, Any]:
    url = f"sqlite:///{tmp_path}/s.db"
    store = ResultStore(url)
    study = store.ensure_study(
        name="dec", model="/models/m", engine_kind="vllm", engine_command=["vllm", "serve"], fixed_flags=[],
        space_hash="h", spec_hash="x", spec={}, objectives=[["capacity_tps", "maximize"]],
        slo="tpot:p99<=20ms", quality_knobs=[])
    for n, (role, params) in enumerate(trials):
        store.save_trial(study.id, n, optuna_trial_id=n, role=role, state="ok", params=params, flags=[],
                         objectives={"capacity_tps": 1000.0 + n}, constraints={}, metrics={}, spec_hash="x")
    return url, store, study


def test_each_knob_alone_beside_the_whole_trial(tmp_path: Path) -> None:
    url, store, study = _store(tmp_path, [("baseline", BASE),
                                          ("enqueued", {"stream_interval": 8, "max_cudagraph_capture_size": 1024})])
    space = SearchSpace.from_mapping(SPACE, "t")
    base, trial = store.trials(study.id)
    assert differing(space, base, trial) == {"stream_interval": (1, 8), "max_cudagraph_capture_size": ("none", 1024)}
    ab = build_ablation(_raw(url), space, "dec", url, base, trial)
    assert ab.name == "dec-ablate-1"
    assert [label for label, _ in ab.variants] == ["stream_interval=8", "max_cudagraph_capture_size=1024"]
    raw = ab.raw
    # the trial again with its exact params, then each knob alone; nothing sampled, nothing stopped early
    assert raw["enqueue"] == [{"stream_interval": 8, "max_cudagraph_capture_size": 1024},
                              {"stream_interval": 8}, {"max_cudagraph_capture_size": 1024}]
    assert raw["budget"] == {"n_trials": 4} and raw["warm_start"] is False and raw["early_stop"] is False
    assert raw["confirm"] == {"enabled": True, "top_k": 3, "repeats": 5, "max_extra": 0, "every": True}
    # the original space's fixed flags travel with the engine's own; workload, SLO and storage are kept
    assert raw["engine"]["extra_flags"] == ["--dtype", "bfloat16", "--max-model-len", "4096"]
    # a file of its own beside the study's: `show --storage` on the study's file still needs no --study-name
    assert (raw["slo"], raw["storage"]) == ("tpot:p99<=20ms", f"sqlite:///{tmp_path}/dec-ablate-1.db")
    derived = SearchSpace.from_mapping(raw["search_space"], "derived")
    assert set(derived.params) == {"stream_interval", "max_cudagraph_capture_size"}
    assert derived.params["max_cudagraph_capture_size"].choices == ("none", 1024)
    # each configuration launches only its own flags: the baseline's value of a knob is never sent
    rendered = [[f for k, v in cand.items() for f in derived.params[k].render(v)] for cand in raw["enqueue"]]
    assert rendered == [["--stream-interval", "8", "--max-cudagraph-capture-size", "1024"],
                        ["--stream-interval", "8"], ["--max-cudagraph-capture-size", "1024"]]
    assert build_spec(raw, "t").name == "dec-ablate-1"


def test_a_knob_the_defaults_switch_off_brings_its_parent_and_kinds_keep_their_form(tmp_path: Path) -> None:
    trial_params = {**BASE, "enable_chunked_prefill": False, "long_prefill_token_threshold": 256,
                    "gpu_memory_utilization": 0.93, "max_num_seqs": 64}
    url, store, study = _store(tmp_path, [("baseline", BASE), ("search", trial_params)])
    space = SearchSpace.from_mapping(SPACE, "t")
    base, trial = store.trials(study.id)
    ab = build_ablation(_raw(url), space, "dec", url, base, trial, repeats=3)
    labels = dict(ab.variants)
    assert set(labels) == {"max_num_seqs=64", "gpu_memory_utilization=0.93", "enable_chunked_prefill=False",
                           "long_prefill_token_threshold=256 (with enable_chunked_prefill=False, which it needs)"}
    assert labels["long_prefill_token_threshold=256 (with enable_chunked_prefill=False, which it needs)"] == {
        "long_prefill_token_threshold": 256, "enable_chunked_prefill": False}
    derived = SearchSpace.from_mapping(ab.raw["search_space"], "derived")
    for cand in ab.raw["enqueue"]:
        assert derived.inactive(cand) == [] and all(derived.params[k].contains(v) for k, v in cand.items())
    # a bool stays --no-flag, a float renders as the number it was, an int range becomes its two values
    assert derived.params["enable_chunked_prefill"].render(False) == ["--no-enable-chunked-prefill"]
    assert derived.params["gpu_memory_utilization"].render(0.93) == ["--gpu-memory-utilization", "0.93"]
    assert derived.params["max_num_seqs"].choices == (256, 64)
    assert ab.raw["confirm"]["top_k"] == 5 and ab.raw["budget"] == {"n_trials": 6}
    only = build_ablation(_raw(url), space, "dec", url, base, trial, only=["max_num_seqs", "gpu_memory_utilization"])
    assert [p for _, p in only.variants] == [{"max_num_seqs": 64}, {"gpu_memory_utilization": 0.93}]
    assert only.raw["enqueue"][0] == trial_params      # the whole trial is measured whatever --knobs names


def test_what_cannot_be_taken_apart_is_refused(tmp_path: Path) -> None:
    url, store, study = _store(tmp_path, [("baseline", BASE), ("enqueued", {"stream_interval": 8}),
                                          ("search", {**BASE, "max_num_seqs": 64, "stream_interval": 2})])
    space = SearchSpace.from_mapping(SPACE, "t")
    base, one, two = store.trials(study.id)
    with pytest.raises(UserError, match="is the baseline"):
        build_ablation(_raw(url), space, "dec", url, base, base)
    with pytest.raises(UserError, match=r"only in stream_interval=8: its own confirmation is that knob's test"):
        build_ablation(_raw(url), space, "dec", url, base, one)
    with pytest.raises(UserError, match=r"does not differ from the baseline in block_size \(it does in: "
                                        r"max_num_seqs, stream_interval\)"):
        build_ablation(_raw(url), space, "dec", url, base, two, only=["block_size"])
    with pytest.raises(UserError, match="repeats"):
        build_ablation(_raw(url), space, "dec", url, base, two, repeats=2)


def test_the_command_prints_its_plan_and_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    url, store, study = _store(tmp_path, [("baseline", BASE),
                                          ("enqueued", {"stream_interval": 8, "max_cudagraph_capture_size": 1024})])
    spec_file = tmp_path / "dec.yaml"
    spec_file.write_text(yaml.safe_dump(_raw(url)))
    assert main(["ablate", "--study", str(spec_file), "--trial", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "ablation dec-ablate-1: the baseline, trial 1 again, and 2 variant(s)" in out
    assert "variant: the baseline plus stream_interval=8" in out
    for argv, said in ((["--trial", "7"], "study 'dec' has no trial 7"),
                       (["--trial", "0"], "trial 0 is the baseline"),
                       (["--study-name", "other"], "no study 'other'"),
                       (["--storage", f"sqlite:///{tmp_path}/none.db"], "no study storage at")):
        assert main(["ablate", "--study", str(spec_file), "--dry-run", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_an_ablation_confirms_every_variant_even_a_dominated_one(tmp_path: Path) -> None:
    """The top candidates are the best and the front; an ablation's variant that loses on both objectives
    is an answer too (its knob alone does not carry the gain), so `confirm.every` repeats all of them."""
    from autotune.tuner.confirm import configs_to_confirm

    url = f"sqlite:///{tmp_path}/e.db"
    store = ResultStore(url)
    objectives = [["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]]
    for every in (False, True):
        study = store.ensure_study(
            name=f"e{every}", model="/m", engine_kind="vllm", engine_command=["vllm"], fixed_flags=[],
            space_hash="h", spec_hash="x", spec={"confirm": {"top_k": 3, "every": every}}, objectives=objectives,
            slo="tpot:p99<=20ms", quality_knobs=[])
        for n, (tps, tpot) in enumerate([(1000, 10.0), (1200, 9.0), (900, 12.0), (1100, 11.0)]):
            store.save_trial(study.id, n, optuna_trial_id=n, role="baseline" if n == 0 else "enqueued", state="ok",
                             params={"k": n}, flags=[] if n == 0 else [f"--k={n}"], spec_hash="x", metrics={},
                             objectives={"capacity_tps": tps, "p50_tpot_ms": tpot}, constraints={})
        base, picks = configs_to_confirm(study, store.trials(study.id), [], top_k=3, max_extra=0)
        assert base is not None and base.number == 0
        # #1 dominates #2 and #3; only `every` keeps them, best first
        assert [t.number for t in picks.candidates] == ([1, 3, 2] if every else [1]), every


def test_a_later_call_with_other_knobs_makes_room_for_its_variants(tmp_path: Path) -> None:
    """The same trial's ablation is one study: a second call naming another knob must not find the
    budget spent by the first call's variants (it would say "not run yet" for ever)."""
    from autotune.tuner.ablation import make_room

    trial_params = {**BASE, "max_num_seqs": 64, "stream_interval": 8}
    url, store, study = _store(tmp_path, [("baseline", BASE), ("search", trial_params)])
    space = SearchSpace.from_mapping(SPACE, "t")
    base, trial = store.trials(study.id)
    first = build_ablation(_raw(url), space, "dec", url, base, trial, only=["max_num_seqs"])
    assert first.raw["budget"] == {"n_trials": 3}
    # the first call measured the baseline, the whole trial and max_num_seqs alone in the derived study
    (tmp_path / "d").mkdir()
    _, derived_store, derived = _store(tmp_path / "d", [("baseline", BASE)]
                                       + [("enqueued", p) for p in first.raw["enqueue"]])
    second = build_ablation(_raw(url), space, "dec", url, base, trial, only=["stream_interval"])
    make_room(second, derived_store.trials(derived.id))
    # the whole trial is shared; max_num_seqs alone is the earlier call's: one more place for stream_interval
    assert second.raw["budget"] == {"n_trials": 4}
    make_room(first, derived_store.trials(derived.id))
    assert first.raw["budget"] == {"n_trials": 3}       # the same call again: nothing more
