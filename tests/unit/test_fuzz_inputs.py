"""Fuzzed user input (hypothesis, derandomized, 1,000 cases per input kind): SLO strings, search-space
YAML, study specs, workload specs and `bench` arguments. Every case ends as a valid object or as a
one-line UserError / exit code 2, never a traceback. Called in-process through the parsers and
`autotune.cli.main(argv)`. Regressions found by the fuzzing are pinned as @example cases.

Strategies mix grammar pieces (so many cases get deep into the parsers) with arbitrary text and values.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.bench.workloads import Workload, parse_workload
from autotune.cli import main
from autotune.errors import UserError
from autotune.slo import SLO
from autotune.space import SearchSpace
from autotune.spec import StudySpec, build_spec, parse_duration

FUZZ = settings(max_examples=1000, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

NUMBERS = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 0.5, 2**63, "1", "x", "1e309", "nan", True, None]))
SCALARS = st.one_of(NUMBERS, st.text(max_size=12), st.booleans(), st.none())
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


def one_line_error(call: Any, *args: Any) -> Any:
    """The call's value, or None after checking that it raised a UserError of one non-empty line."""
    try:
        return call(*args)
    except UserError as e:
        message = str(e)
        assert message and "\n" not in message, repr(message)
        return None


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> int:
    """`autotune ARGV` in-process: its exit code (argparse's SystemExit included) and a one-line error."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), (code, err)
    if code == 2:
        assert err and "\n" not in err and "Traceback" not in err, err
    return code


# -- SLO strings ------------------------------------------------------------------------------------
SLO_PIECES = st.sampled_from(["ttft", "tpot", "itl", "e2el", "TTFT", "foo", ":", "p50", "p99", "p99.9", "p100", "p0",
                              "p", "mean", "<=", "<", ">=", "=", "==", "1", "0", "-1", "1e309", "nan", "inf", "ms",
                              "s", "m", "h", ",", ".", " ", "1.5", "800", "9" * 30, "\n", "\x00", "é"])
SLO_TEXT = st.one_of(st.lists(SLO_PIECES, max_size=14).map("".join), st.text(max_size=40))


@FUZZ
@given(SLO_TEXT)
@example("ttft=1e309s")          # edges: an infinite and a NaN limit (both rejected)
@example("ttft:p99<=nanms")
def test_slo_strings(text: str) -> None:
    slo = one_line_error(SLO.parse, text)
    if slo is not None:
        assert isinstance(slo, SLO) and slo.terms
        assert all(math.isfinite(t.limit_ms) and t.limit_ms > 0 for t in slo.terms)
        assert SLO.parse(str(slo)) == slo          # what is stored reads back the same


# -- search-space YAML ------------------------------------------------------------------------------
PARAM = st.fixed_dictionaries({}, optional={
    "type": st.sampled_from(["int", "float", "bool", "categorical", "str", "", None]),
    "low": NUMBERS, "high": NUMBERS, "step": NUMBERS, "log": st.one_of(st.booleans(), SCALARS),
    "choices": st.one_of(st.lists(SCALARS, max_size=4), SCALARS), "default": SCALARS,
    "when": st.one_of(st.dictionaries(st.sampled_from(["max_num_seqs", "x"]), st.lists(SCALARS, max_size=2),
                                      max_size=2), SCALARS),
    "requires_gpus": NUMBERS, "quality": SCALARS, "flag": SCALARS, "junk": SCALARS})
SPACE = st.one_of(
    st.fixed_dictionaries({"params": st.dictionaries(st.sampled_from(["max_num_seqs", "enable_chunked_prefill",
                                                                      "gpu_memory_utilization", "x", "", "A b"]),
                                                     st.one_of(PARAM, SCALARS), max_size=3)},
                          optional={"fixed": st.one_of(st.dictionaries(st.text(max_size=6), SCALARS, max_size=2),
                                                       SCALARS),
                                    "description": SCALARS, "extra": SCALARS}),
    VALUES)


@FUZZ
@given(raw=SPACE, as_text_noise=st.booleans())
# regressions found by this test: each was a traceback (TypeError, ValueError, AttributeError)
@example(raw={"params": {"max_num_seqs": {"type": "int", "requires_gpus": None}}}, as_text_noise=False)
@example(raw={"params": {"max_num_seqs": {"type": "int", "requires_gpus": "x"}}}, as_text_noise=False)
@example(raw={"params": {"max_num_seqs": {"type": "int", "when": 1}}}, as_text_noise=False)
@example(raw={"params": {"max_num_seqs": {"type": "int", "low": 1, "high": float("inf")}}}, as_text_noise=False)
@example(raw={"params": {"gpu_memory_utilization": {"type": "float", "low": 0.1, "high": float("nan")}}},
         as_text_noise=False)   # was accepted silently
def test_search_space_yaml(raw: Any, as_text_noise: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz-space.yaml"
    text = yaml.safe_dump(raw, allow_unicode=True)
    path.write_text(text + ("\n  - : [" if as_text_noise else ""))   # sometimes malformed YAML
    space = one_line_error(SearchSpace.load, str(path))
    if space is not None:
        narrowed = space.narrowed(1, False)
        baseline = narrowed.baseline_params()
        assert isinstance(narrowed.render(baseline), list)
        narrowed.violations(baseline, narrowed.fixed_flags, 1)
        assert len(space.fingerprint()) == 16


# -- study specs ------------------------------------------------------------------------------------
SPEC = st.fixed_dictionaries({"model": st.one_of(st.just("models/demo"), SCALARS)}, optional={
    "name": SCALARS, "slo": st.one_of(SLO_TEXT, SCALARS),
    "engine": st.one_of(st.fixed_dictionaries({}, optional={
        "kind": st.sampled_from(["vllm", "sim", "x"]), "command": st.one_of(st.lists(SCALARS, max_size=3), SCALARS),
        "extra_flags": st.one_of(st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=5), SCALARS,
                                                                                 max_size=2), SCALARS),
        "env": st.one_of(st.dictionaries(st.text(max_size=5), SCALARS, max_size=2), SCALARS),
        "startup_timeout_s": NUMBERS, "gpu": SCALARS, "num_gpus": NUMBERS, "time_scale": NUMBERS}), SCALARS),
    "workload": st.one_of(st.text(max_size=30), VALUES),
    "load": st.one_of(st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["capacity", "fixed", "x"]), "concurrency": NUMBERS, "rate": NUMBERS,
        "max_steps": NUMBERS, "requests_per_step": NUMBERS, "warmup": NUMBERS, "stall_timeout_s": NUMBERS}), SCALARS),
    "objectives": st.one_of(st.lists(st.sampled_from(["capacity_tps", "output_tps", "p50_tpot_ms", "x"]),
                                     max_size=3), SCALARS),
    "budget": st.one_of(st.fixed_dictionaries({}, optional={"n_trials": NUMBERS, "timeout": st.one_of(
        NUMBERS, st.sampled_from(["8h", "90m", "1d", "0s", "-1h", "h", "1e309s"]))}), SCALARS),
    "gpus": st.one_of(st.lists(NUMBERS, max_size=3), SCALARS), "seed": NUMBERS, "storage": SCALARS,
    "search_space": st.one_of(st.sampled_from(["cpu", "default"]), VALUES), "telemetry": VALUES,
    "baseline": VALUES, "enqueue": VALUES, "sampler": SCALARS, "unknown_key": SCALARS})


@FUZZ
@given(SPEC)
@example({"model": "m", "budget": {"timeout": "1e309s"}})   # edges: infinite and NaN timeouts
@example({"model": "m", "budget": {"timeout": float("nan")}})
def test_study_specs(raw: dict[str, Any]) -> None:
    spec = one_line_error(build_spec, raw, "fuzz.yaml")
    if spec is not None:
        assert isinstance(spec, StudySpec)
        assert spec.slo_obj.terms
        spec.public_dict()
        assert len(spec.identity_hash()) == 16
        if spec.budget.timeout is not None:
            seconds = one_line_error(parse_duration, spec.budget.timeout)
            assert seconds is None or (math.isfinite(seconds) and seconds > 0)


# -- workload specs ---------------------------------------------------------------------------------
WL_PIECES = st.sampled_from(["random", "jsonl", "prefix", "sharegpt", ":", ",", "=", "input_len", "output_len",
                             "range_ratio", "prefix_len", "suffix_len", "path", "1", "0", "-5", "0.5", "1e9", "nan",
                             "inf", "x", " ", "/dev/null", "autotune/data/bench_sample.jsonl", "=="])
WORKLOAD = st.one_of(st.lists(WL_PIECES, max_size=14).map("".join), st.text(max_size=30),
                     st.dictionaries(st.sampled_from(["kind", "input_len", "output_len", "range_ratio", "path",
                                                      "prefix_len", "suffix_len", "x"]), SCALARS, max_size=4))


@FUZZ
@given(WORKLOAD)
@example("random:input_len=8,output_len=8,range_ratio=nan")   # edge: a NaN ratio
def test_workload_specs(spec: Any) -> None:
    workload = one_line_error(parse_workload, spec)
    if workload is not None:
        assert isinstance(workload, Workload) and workload.params()


# -- bench arguments through the CLI ----------------------------------------------------------------
BENCH_FLAGS = st.sampled_from(["--url", "--model", "--endpoint", "--workload", "--concurrency", "--rate",
                               "--burstiness", "--num-requests", "--duration", "--warmup", "--slo", "--seed",
                               "--tokenizer", "--timeout", "--capacity", "--max-steps", "--requests-per-step",
                               "--upper", "--start", "--nope", "-h"])
BENCH_VALUES = st.one_of(st.sampled_from(["http://127.0.0.1:1", "127.0.0.1:1", "ftp://x", "m", "chat", "completions",
                                          "1", "0", "-1", "2.5", "inf", "nan", "1e309", "ttft=1s", "concurrency",
                                          "rate", "random:input_len=4,output_len=2", "x", ""]), WL_PIECES,
                         st.text(max_size=10))
BENCH_ARGS = st.lists(st.one_of(st.tuples(BENCH_FLAGS, BENCH_VALUES).map(list), st.tuples(BENCH_FLAGS).map(list)),
                      max_size=7).map(lambda parts: [x for p in parts for x in p])


@FUZZ
@given(args=BENCH_ARGS)
def test_bench_arguments(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on 127.0.0.1:1: a valid command ends at "cannot reach the server" (exit 2).
    argv = ["bench", "--url", "http://127.0.0.1:1", "--model", "m", "--num-requests", "2", *args]
    if "--help" in argv or "-h" in argv:
        argv = [a for a in argv if a not in ("-h", "--help")]
    cli(argv, capsys)
