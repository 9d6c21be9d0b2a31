"""The export decided by the confirmation's verdict (issue 27), through a real SQLite store and the
`autotune export` / `show` commands: the case that exported vLLM's defaults although FP8 beat them in
every paired round, a first run its repeats do not reproduce, and which close or flagged trials join
the confirmation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.report.confirmed import confirmation_lines
from autotune.store.repository import ResultStore
from autotune.tuner.picks import left_out, pick_candidates
from autotune.tuner.verdict import summarize_confirmations

OBJECTIVES = [["capacity_tps", "maximize"], ["p50_tpot_ms", "minimize"]]
DEFAULTS = {"quantization": "none", "kv_cache_dtype": "auto"}


def _store(tmp_path: Path, quality: list[str], confirm: dict[str, Any] | None = None) -> tuple[ResultStore, Any]:
    store = ResultStore(f"sqlite:///{tmp_path}/study.db")
    study = store.ensure_study(
        name="fp8", model="/models/m", engine_kind="vllm", engine_command=["vllm", "serve"], fixed_flags=[],
        space_hash="h", spec_hash="x", spec={"confirm": confirm or {"top_k": 2, "repeats": 3}},
        objectives=OBJECTIVES, slo="ttft:p99<=1000ms", quality_knobs=quality)
    return store, study


def _trial(store: ResultStore, study: Any, number: int, role: str, params: dict[str, Any], flags: list[str],
           tps: float, tpot: float, bracket: tuple[float, float], mflags: list[str] | None = None) -> Any:
    return store.save_trial(
        study.id, number, optuna_trial_id=number, role=role, state="ok", params=params, flags=flags,
        objectives={"capacity_tps": tps, "p50_tpot_ms": tpot}, constraints={"slo:ttft:p99": -50.0, "failure": 0.0},
        metrics={"p99_ttft_ms": 950.0}, spec_hash="x", measurement_flags=mflags or [],
        capacity={"mode": "concurrency", "capacity": bracket[0], "bracket": list(bracket)})


def _repeats(store: ResultStore, study: Any, trial: Any, runs: list[tuple[float, float, tuple[float, float]]]) -> None:
    """Rounds 0.. of `trial`: (capacity_tps, p50_tpot_ms, the bracket its capacity search found)."""
    for r, (tps, tpot, bracket) in enumerate(runs):
        store.save_confirmation(study_id=study.id, trial_id=trial.id, round=r, position=0, seed=1000 + r, state="ok",
                                objectives={"capacity_tps": tps, "p50_tpot_ms": tpot},
                                constraints={"slo:ttft:p99": -40.0},
                                capacity={"mode": "concurrency", "capacity": bracket[0], "bracket": list(bracket)})


def _issue_table(tmp_path: Path) -> tuple[ResultStore, Any]:
    """Issue 27's table: capacity_tps and the streams at which the SLO held (bracket), first run and three
    paired rounds, of the baseline, FP8 weights + FP8 KV cache (#1) and the best output-preserving (#7)."""
    store, study = _store(tmp_path, ["quantization", "kv_cache_dtype"])
    base = _trial(store, study, 0, "baseline", DEFAULTS, [], 5831, 13.1, (76, 86))
    fp8 = _trial(store, study, 1, "enqueued", {"quantization": "fp8", "kv_cache_dtype": "fp8"},
                 ["--quantization", "fp8", "--kv-cache-dtype", "fp8"], 6976, 19.5, (149, 162))
    plain = _trial(store, study, 7, "search", {**DEFAULTS, "max_num_seqs": 128}, ["--max-num-seqs", "128"],
                   5580, 12.4, (66, 76))
    _repeats(store, study, base, [(5783, 13.0, (82, 90)), (5799, 13.1, (82, 90)), (5867, 13.0, (82, 90))])
    _repeats(store, study, fp8, [(6957, 18.2, (129, 149)), (6971, 19.6, (157, 161)), (6891, 18.1, (129, 149))])
    _repeats(store, study, plain, [(5608, 12.3, (66, 70)), (5581, 12.4, (66, 71)), (5609, 12.3, (66, 71))])
    return store, study


def _export(store: ResultStore, out: Path, *extra: str) -> int:
    return main(["export", "--storage", store.url, "--format", "vllm-yaml", "-o", str(out), *extra])


def _show(store: ResultStore, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["show", "--storage", store.url, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_issue_table_exports_fp8_and_output_preserving_gives_the_baseline(tmp_path: Path, capsys) -> None:
    store, study = _issue_table(tmp_path)
    # the repeats of #1 met the SLO at 129 / 157 / 129 streams against the first run's 149 at the same
    # tokens/s: it stays on the front (the old rule dropped it and exported the defaults)
    shown = _show(store, capsys)
    conf = shown["confirmations"]
    assert all(conf[n]["survives"] for n in ("0", "1", "7"))
    assert conf["1"]["loads"] == [129, 157, 129] and conf["1"]["first_run_bracket"] == [149, 162]
    assert conf["1"]["reproduced"]["capacity_tps"] is True and conf["1"]["medians"]["capacity_tps"] == 6957
    assert conf["1"]["quality"] == {"quantization": "fp8", "kv_cache_dtype": "fp8"} and not conf["7"]["quality"]
    assert shown["best"] == 1 and shown["output_preserving"]["best"] == 0
    # rows stored without a stamp, as the H200 study's were: judged by the range, and said so
    assert shown["spread_rule"] == "range" and conf["1"]["verdict"][0]["spread_rule"] == "range"
    assert shown["pareto_front_confirmed"] and 1 in shown["pareto_front"]

    out = tmp_path / "best.yaml"
    assert _export(store, out) == 0
    text = out.read_text()
    assert "# autotune: study fp8, trial 1 (enqueued)" in text
    assert ("# WARNING: changes output quality: quantization=fp8, kv_cache_dtype=fp8 (quality knobs the study "
            "opted into)") in text and "--output-preserving" in text
    assert "# chosen: trial 1: best confirmed median on capacity_tps over 3 repeats, capacity_tps against the " \
           "baseline: better" in text
    assert "# against the baseline: capacity_tps x1.193 [" in text and "over 3 paired rounds, spread 1.4% (range): better" in text
    assert "quantization: fp8" in text and "kv-cache-dtype: fp8" in text

    kept = tmp_path / "kept.yaml"
    assert _export(store, kept, "--output-preserving") == 0
    text = kept.read_text()
    assert "# autotune: study fp8, trial 0 (baseline)" in text and "WARNING" not in text
    assert ("# this is the baseline (vLLM's defaults): no output-preserving candidate beat it after confirmation: "
            "#7 is worse (capacity_tps x0.963 [0.946, 0.980] over 3 paired rounds, spread 1.4% (range): worse)") in text
    assert "quantization" not in text.split("\n# run:")[1]      # the defaults' file sets no quality knob


def test_output_preserving_and_a_named_trial_are_one_choice_too_many(tmp_path: Path, capsys) -> None:
    store, _ = _issue_table(tmp_path)
    assert _export(store, tmp_path / "x.yaml", "--output-preserving", "--trial", "7") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--output-preserving" in err and "Traceback" not in err
    # --trial keeps its behaviour: a confirmed trial's header states its own verdict
    assert _export(store, tmp_path / "seven.yaml", "--trial", "7") == 0
    assert "# against the baseline: capacity_tps x0.963 [0.946, 0.980]" in (tmp_path / "seven.yaml").read_text()


def test_repeats_worse_than_the_first_run_rank_it_and_the_better_config_is_exported(tmp_path: Path, capsys) -> None:
    """#1's first run (2,000 tok/s) is the study's best, but its repeats measure ~1,200: it is ranked by
    them and #2, whose repeats hold ~1,500, is exported; `show` reports #1's first run as not reproduced."""
    store, study = _store(tmp_path, [])
    base = _trial(store, study, 0, "baseline", {}, [], 1000, 20, (40, 44))
    lucky = _trial(store, study, 1, "search", {"max_num_seqs": 512}, ["--max-num-seqs", "512"], 2000, 21, (80, 88))
    steady = _trial(store, study, 2, "search", {"max_num_seqs": 256}, ["--max-num-seqs", "256"], 1500, 20, (60, 66))
    _repeats(store, study, base, [(1000, 20, (40, 44)), (990, 20, (40, 44)), (1010, 20, (40, 44))])
    _repeats(store, study, lucky, [(1200, 21, (48, 52)), (1180, 21, (47, 52)), (1220, 21, (48, 52))])
    _repeats(store, study, steady, [(1500, 20, (60, 66)), (1490, 20, (60, 66)), (1510, 20, (60, 66))])
    shown = _show(store, capsys)
    assert shown["confirmations"]["1"]["survives"] and shown["confirmations"]["1"]["reproduced"]["capacity_tps"] is False
    assert shown["best"] == 2
    out = tmp_path / "best.yaml"
    assert _export(store, out) == 0
    text = out.read_text()
    assert "trial 2 (search)" in text and "# first run 1500 -> median 1500 (x1.000)" in text
    trials = store.trials(study.id)
    lines = confirmation_lines(study, trials, summarize_confirmations(study, trials, store.confirmations(study.id)))
    lucky_line = next(x for x in lines if x.startswith("  #1 (search)"))
    assert "first run 2000 -> median 1200 (x0.600): FIRST RUN NOT REPRODUCED" in lucky_line and "; stays" in lucky_line


def test_no_candidate_beats_the_baseline_the_baseline_is_exported_with_why(tmp_path: Path) -> None:
    store, study = _store(tmp_path, [])
    base = _trial(store, study, 0, "baseline", {}, [], 1000, 20, (40, 44))
    same = _trial(store, study, 3, "search", {"max_num_seqs": 64}, ["--max-num-seqs", "64"], 1100, 20, (44, 48))
    _repeats(store, study, base, [(1000, 20, (40, 44)), (1010, 20, (40, 44)), (995, 20, (40, 44))])
    _repeats(store, study, same, [(990, 20, (40, 44)), (1012, 20, (40, 44)), (1000, 20, (40, 44))])
    out = tmp_path / "best.yaml"
    assert _export(store, out) == 0
    text = out.read_text()
    assert "trial 0 (baseline)" in text
    assert "# this is the baseline (vLLM's defaults): no candidate beat it after confirmation: #3: capacity_tps x" in text
    assert "no gain beyond noise; its median 1000 against the baseline's 1000" in text


def test_close_and_flagged_first_runs_join_the_confirmation_within_its_budget(tmp_path: Path, capsys) -> None:
    """The issue's runner-up: a flagged first run 5.7 % below the best lost its place to the best and the
    best output-preserving trial. Beyond top_k, trials within the noise of the best (5 % before the
    baseline has repeats) join first, then flagged ones, up to confirm.max_extra; `show` names the rest."""
    store, study = _store(tmp_path, ["kv_cache_dtype"], confirm={"top_k": 2, "max_extra": 2})
    base = _trial(store, study, 0, "baseline", {"kv_cache_dtype": "auto"}, [], 5831, 13, (76, 86))
    best = _trial(store, study, 1, "search", {"kv_cache_dtype": "fp8"}, ["--kv-cache-dtype", "fp8"], 6976, 19, (149, 162))
    plain = _trial(store, study, 7, "search", {"kv_cache_dtype": "auto", "max_num_seqs": 128},
                   ["--max-num-seqs", "128"], 5580, 12, (66, 76))
    flagged = _trial(store, study, 12, "search", {"kv_cache_dtype": "fp8", "max_num_seqs": 512},
                     ["--kv-cache-dtype", "fp8", "--max-num-seqs", "512"], 6577, 21, (140, 150), ["client_saturated"])
    close = _trial(store, study, 5, "search", {"kv_cache_dtype": "fp8", "max_num_seqs": 384},
                   ["--kv-cache-dtype", "fp8", "--max-num-seqs", "384"], 6700, 22, (140, 150))
    far = _trial(store, study, 9, "search", {"kv_cache_dtype": "fp8", "max_num_seqs": 96},
                 ["--kv-cache-dtype", "fp8", "--max-num-seqs", "96"], 6000, 17, (100, 110), ["wide_bracket"])
    trials = store.trials(study.id)
    picks = pick_candidates(study, trials, 2, 2, [])
    assert [t.number for t in picks.candidates] == [1, 7, 5, 12]     # top 2, then close (4.0 %), then flagged
    assert picks.noise == pytest.approx(0.05) and "no configuration repeated twice yet" in picks.noise_why
    assert [(t.number, why.split(",")[0]) for t, why in picks.left_out] == [(9, "flagged wide_bracket")]
    assert [t.number for t in pick_candidates(study, trials, 2, 0, []).candidates] == [1, 7]
    # the confirmation ran with max_extra 1: #5 joined, #12 and #9 were left out; `show` says so and why
    rounds = [(1.0, (80, 90)), (1.0, (80, 90)), (1.0, (80, 90))]
    for t in (base, best, plain, close):
        _repeats(store, study, t, [(t.objectives["capacity_tps"] * k, 15, b) for k, b in rounds])
    shown = _show(store, capsys)
    assert [(x["trial"], x["why"].split(",")[0]) for x in shown["confirmation_left_out"]] == [
        (12, "flagged client_saturated"), (9, "flagged wide_bracket")]
    assert "5.7% from the best (#1)" in shown["confirmation_left_out"][0]["why"]
    trials, rows = store.trials(study.id), store.confirmations(study.id)
    skipped, note = left_out(study, trials, rows, 1)
    lines = confirmation_lines(study, trials, summarize_confirmations(study, trials, rows), skipped, note)
    assert "  #12 left out of the confirmation: flagged client_saturated, first run 5.7% from the best (#1)" in lines
    # a later confirmation keeps every trial that has repeats, whatever the picks say now
    again = pick_candidates(study, store.trials(study.id), 1, 0, store.confirmations(study.id))
    assert {t.number for t in again.candidates} == {1, 7, 5}


def test_the_noise_at_pick_time_comes_from_the_repeats_once_they_exist(tmp_path: Path) -> None:
    store, study = _store(tmp_path, [])
    base = _trial(store, study, 0, "baseline", {}, [], 1000, 20, (40, 44))
    _trial(store, study, 1, "search", {"max_num_seqs": 64}, ["--max-num-seqs", "64"], 2000, 20, (80, 88))
    near = _trial(store, study, 2, "search", {"max_num_seqs": 96}, ["--max-num-seqs", "96"], 1850, 20, (74, 80))
    _repeats(store, study, base, [(1000, 20, (40, 44)), (960, 20, (40, 44)), (1040, 20, (40, 44))])   # spread 8 %
    trials, rows = store.trials(study.id), store.confirmations(study.id)
    picks = pick_candidates(study, trials, 1, 1, rows)
    assert picks.noise == pytest.approx(0.16) and "twice the median repeat spread of 1 configuration(s) (8.0%)" \
        in picks.noise_why
    assert [t.number for t in picks.extras] == [near.number]                     # 7.5 % below: inside 16 %
    skipped, note = left_out(study, trials, rows, 1)
    assert [t.number for t, _ in skipped] == [2] and "noise 16.0%" in note and "confirm.max_extra = 1" in note


def test_a_baseline_on_a_knife_edge_does_not_set_the_noise_alone(tmp_path: Path) -> None:
    """The H100 decode study: the defaults' repeats spread 30.2 % (their p99 TPOT near its limit), the
    candidates' 1.9 and 17.4 %. The noise is twice the median spread (17.4 % -> 34.8 %), not twice the
    baseline's (60.3 %), so a trial 40 % behind the best is no longer "within the noise"."""
    store, study = _store(tmp_path, [])
    base = _trial(store, study, 0, "baseline", {}, [], 16636, 18.5, (343, 388))
    best = _trial(store, study, 1, "search", {"max_num_seqs": 512}, ["--max-num-seqs", "512"], 17895, 18.7, (382, 388))
    other = _trial(store, study, 3, "search", {"max_num_seqs": 266}, ["--max-num-seqs", "266"], 14100, 17.5, (267, 273))
    far = _trial(store, study, 7, "search", {"max_num_seqs": 200}, ["--max-num-seqs", "200"], 10700, 17.0, (200, 210))
    _repeats(store, study, base, [(14847, 16.7, (266, 268)), (10954, 18.7, (224, 236))])
    _repeats(store, study, best, [(17239, 18.5, (359, 369)), (17568, 19.1, (382, 388)), (17358, 18.8, (382, 390))])
    _repeats(store, study, other, [(16573, 13.3, (250, 257)), (14060, 16.8, (259, 267)), (16943, 12.7, (250, 257))])
    trials, rows = store.trials(study.id), store.confirmations(study.id)
    picks = pick_candidates(study, trials, 2, 2, rows)
    assert picks.noise == pytest.approx(2 * (16943 - 14060) / 16573, rel=1e-6)
    assert "median repeat spread of 3 configurations (17.4%; the baseline's 30.2%)" in picks.noise_why
    assert far not in picks.candidates and picks.left_out == []           # 40.2 % behind: outside 34.8 %


def test_a_baseline_with_flags_of_its_own_is_not_called_the_defaults(tmp_path: Path) -> None:
    # another study's winner measured as this one's baseline (the H200 cross run): "vLLM's defaults"
    # would say the defaults were measured
    from autotune.tuner.winner import baseline_words

    store, study = _store(tmp_path, [])
    plain = _trial(store, study, 0, "baseline", {}, [], 100.0, 10.0, (8, 9))
    given = _trial(store, study, 1, "baseline", {"max_num_seqs": 133}, ["--max-num-seqs", "133"], 100.0, 10.0, (8, 9))
    assert baseline_words(plain) == "the baseline (vLLM's defaults)"
    assert baseline_words(given) == "the baseline (vLLM's defaults but --max-num-seqs 133)"
