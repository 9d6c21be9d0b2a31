"""PD layouts (issue 26) without processes: the --pd-* grammar, the GPUs a split asks for wherever a layout
is sized, the space's choices on 2 and 4 GPUs, the router's two request legs, the hand-off's physics and
`estimate --pd` (text, JSON, a bad split)."""

from __future__ import annotations

import json

import pytest

from autotune.cli import main
from autotune.engine.router import decode_body, prefill_body
from autotune.errors import UserError
from autotune.flags import flags_to_mapping
from autotune.pdlayout import PDLayout, instances_of, split_pd_flags
from autotune.perfmodel.disagg import transfer
from autotune.perfmodel.predict import plan, predict_launch
from autotune.space import SearchSpace
from autotune.space.constraints import violations
from autotune.tuner.driver import layout_gpus


def test_split_takes_the_pd_flags_out_and_names_the_layout() -> None:
    layout, rest = split_pd_flags(["--max-num-seqs", "64", "--pd-prefill", "2", "--pd-decode=1",
                                   "--pd-kv-buffer-device", "cpu", "--enforce-eager"])
    assert layout == PDLayout(2, 1, "cpu") and layout.label == "2p1d" and layout.instances == 3
    assert rest == ["--max-num-seqs", "64", "--enforce-eager"]
    assert json.loads(layout.kv_transfer_config()) == {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                                       "kv_buffer_device": "cpu"}
    assert split_pd_flags(["--max-num-seqs", "64"]) == (None, ["--max-num-seqs", "64"])


@pytest.mark.parametrize("flags, words", [
    (["--pd-prefill", "1"], "needs both"),
    (["--pd-prefill", "0", "--pd-decode", "1"], "whole number"),
    (["--pd-prefill", "x", "--pd-decode", "1"], "whole number"),
    (["--pd-prefill", "1", "--pd-decode", "1", "--pd-kv-buffer-device", "disk"], "one of cuda, cpu"),
    (["--pd-prefill", "1", "--pd-decode", "1", "--pd-router", "x"], "not a PD layout flag"),
])
def test_a_malformed_pd_layout_is_a_one_line_error(flags: list[str], words: str) -> None:
    with pytest.raises(UserError, match=words) as got:
        split_pd_flags(flags)
    assert "\n" not in str(got.value)


def test_a_split_needs_its_instances_times_tp_gpus_wherever_a_layout_is_sized() -> None:
    flags = ["--pd-prefill", "1", "--pd-decode", "2", "--tensor-parallel-size", "2"]
    assert instances_of(flags_to_mapping(flags)) == 3 and layout_gpus(flags) == 6
    assert layout_gpus(["--tensor-parallel-size", "2"]) == 2
    assert violations(flags_to_mapping(flags), 6, None) == []
    assert any("6 GPUs > 4 given" in v for v in violations(flags_to_mapping(flags), 4, None))


def test_the_default_space_offers_the_splits_the_gpus_allow() -> None:
    space = SearchSpace.load("default")
    two = space.narrowed(2, False).params
    assert {"1p1d"} <= set(two["parallel_layout"].choices) and "1p2d" not in two["parallel_layout"].choices
    assert two["pd_kv_buffer_device"].when == {"parallel_layout": ("1p1d", "1p2d", "2p1d", "1p1d-tp2")}
    four = space.narrowed(4, False).params["parallel_layout"].choices
    assert {"1p1d", "1p2d", "2p1d", "1p1d-tp2"} <= set(four)
    assert "pd_kv_buffer_device" not in space.narrowed(1, False).params
    # an engine's --help never lists --pd-*: the splits and their knob stay where it lists --kv-transfer-config
    kept, notices = space.narrowed(2, False).supported(lambda flags: [f for f in flags if f.startswith("--pd-")])
    assert "1p1d" in kept.params["parallel_layout"].choices and "pd_kv_buffer_device" in kept.params and not notices
    old, notices = space.narrowed(2, False).supported(lambda flags: [f for f in flags if f == "--kv-transfer-config"])
    assert "1p1d" not in old.params["parallel_layout"].choices and "pd_kv_buffer_device" not in old.params
    assert "the engine lacks --kv-transfer-config (not in its --help): parallel_layout choice 1p1d dropped, never sent" in notices
    assert not any(f.startswith("--pd-") for f in kept.flag_names())
    rendered = kept.render({"parallel_layout": "1p1d", "pd_kv_buffer_device": "cpu"})
    assert rendered == ["--pd-prefill", "1", "--pd-decode", "1", "--pd-kv-buffer-device", "cpu"]


def test_the_memory_prior_judges_one_instance_of_a_split() -> None:
    single = predict_launch("llama-3.1-8b", ["--max-model-len", "4096"], "H100", 2)
    split = predict_launch("llama-3.1-8b", ["--max-model-len", "4096", "--pd-prefill", "1", "--pd-decode", "1"],
                           "H100", 2)
    assert single is not None and split is not None and split.kv_cache_tokens == single.kv_cache_tokens


def test_the_router_legs_follow_vllms_proxy() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 64, "stream": True, "min_tokens": 4,
            "stream_options": {"include_usage": True}}
    first = prefill_body(body)
    assert first["max_tokens"] == 1 and first["stream"] is False
    assert "stream_options" not in first and "min_tokens" not in first
    assert first["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                           "remote_engine_id": None, "remote_block_ids": None,
                                           "remote_host": None, "remote_port": None}
    chat = prefill_body({"messages": [], "max_completion_tokens": 50})
    assert chat["max_completion_tokens"] == 1
    handoff = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [0, 1]}
    second = decode_body(body, handoff)
    assert second == {**body, "kv_transfer_params": handoff} and body.get("kv_transfer_params") is None
    assert decode_body(body, None) == body


def test_the_hand_off_moves_the_prompts_kv_over_the_link() -> None:
    p = plan("llama-3.1-8b", [], "H200", 1)
    moved = transfer(p, 4096)
    assert moved.bytes_per_gpu == p.budget.kv_bytes_per_token * 4096        # 128 KiB a token: 512 MiB
    assert moved.seconds == pytest.approx(moved.bytes_per_gpu / (450e9 * 0.7) + 0.5e-3)
    assert transfer(p, 4096, "cpu").seconds > moved.seconds * 10            # host staging: PCIe, twice


def test_estimate_reports_the_split_beside_the_single_instance(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "--gpu", "H200", "--model-profile", "llama-3.1-8b", "--max-model-len", "4096", "--max-num-seqs", "4",
            "--input-len", "2048", "--output-len", "64", "--no-curve", "--pd", "1p1d"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "SIMULATED prefill/decode split 1P+1D (1p1d, 2 GPUs, NixlConnector)" in text
    assert "| single: tok/s  TTFT p50 ms  TPOT p50 ms | 1P+1D: tok/s  TTFT p50 ms  TPOT p50 ms" in text
    assert "assumption: KV over the GPU link (H200: 450 GB/s" in text and "not measured" in text
    assert "tok/s for both: concurrency x output / (TTFT + (output - 1) x TPOT), from the medians" in text
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (pd,) = report["pd"]
    assert report["simulated"] is True and pd["layout"] == "1p1d" and pd["gpus"] == 2
    row = pd["rows"][0]
    assert row["concurrency"] == 1 and set(row) == {"concurrency", "single", "split"}
    for side in ("single", "split"):
        assert row[side]["p50_ttft_ms"] > 0 and row[side]["p50_tpot_ms"] > 0
    # one user: the split's TTFT is the single instance's plus the hand-off (within a step's rounding)
    assert row["split"]["p50_ttft_ms"] >= row["single"]["p50_ttft_ms"]


def test_estimate_refuses_a_split_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--gpu", "H200", "--model-profile", "llama-3.1-8b", "--pd", "1p0d"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autotune estimate: error: --pd '1p0d'") and "\n" not in err


def test_a_splits_serving_limits_are_its_decode_instances() -> None:
    """The capacity search's knee (bench/step_bounds.py): a split batches on its decode instances."""
    from autotune.bench.step_bounds import ServerLimits

    flags = ["--max-num-seqs", "32", "--pd-prefill", "1", "--pd-decode", "2"]
    assert ServerLimits.from_flags(flags, 10_000) == ServerLimits(64, 20_000)
    assert ServerLimits.from_flags(flags[:2], 10_000) == ServerLimits(32, 10_000)
