"""Redaction of secrets (autotune/redact.py) and the store's own scrubbing: whatever a caller hands the
store, the shapes of secrets (`--api-key X`, `HF_TOKEN=X`, `hf_...`, `api_key: X`) never land in it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from autotune.redact import REDACTED, Redactor, redact_flags, scrub, secret_flag_values
from autotune.store.repository import ResultStore

KEY, HF = "sk-live-0123456789abcdef", "hf_abcdefghijklmnopqrstuvwxyz012345"


def test_flags_keep_their_names_and_lose_their_values() -> None:
    assert redact_flags(["--dtype", "bfloat16", "--api-key", KEY, f"--hf-token={HF}", "--max-num-seqs", "8"]) == [
        "--dtype", "bfloat16", "--api-key", REDACTED, f"--hf-token={REDACTED}", "--max-num-seqs", "8"]
    assert redact_flags(["--hf-token", "--enforce-eager"]) == ["--hf-token", "--enforce-eager"]  # a bare switch
    assert redact_flags(["docker", "run", "-e", f"HF_TOKEN={HF}", "img"]) == [
        "docker", "run", "-e", f"HF_TOKEN={REDACTED}", "img"]
    assert secret_flag_values(["--api-key", KEY, "-e", f"HF_TOKEN={HF}"]) == {KEY, HF}


def test_shapes_are_scrubbed_from_free_text() -> None:
    text = (f"non-default args: {{'api_key': '{KEY}'}} ARGV --api-key {KEY} env HF_TOKEN={HF} "
            f"Authorization: Bearer {KEY} token {HF} api_key: '***'")
    clean = scrub(text)
    assert KEY not in clean and HF not in clean
    assert "api_key: '***'" in clean and "--api-key ***" in clean


def test_known_values_are_replaced_wherever_they_appear(tmp_path: Path) -> None:
    r = Redactor.for_engine({"HF_TOKEN": "plain-secret-value", "OTHER": "kept-value"}, ["--api-key", KEY])
    assert r.text("a plain-secret-value b kept-value c" + KEY) == "a *** b kept-value c***"
    assert r.obj({"k": ["x plain-secret-value", 3]}) == {"k": ["x ***", 3]}
    log = tmp_path / "trial.log"
    log.write_text(f"line {KEY}\n")
    r.file(log)
    assert log.read_text() == "line ***\n"
    r.file(Path("/dev/full"))   # a device is left alone, without reading it forever


def test_the_store_scrubs_whatever_it_is_given(tmp_path: Path) -> None:
    store = ResultStore(f"sqlite:///{tmp_path}/s.db")
    rec = store.ensure_study(name="s", model="m", engine_kind="vllm",
                             engine_command=["docker", "run", "-e", f"HF_TOKEN={HF}", "img"],
                             fixed_flags=["--api-key", KEY], space_hash="h", spec_hash="h",
                             spec={"engine": {"extra_flags": ["--api-key", KEY]}, "note": f"--api-key {KEY}"},
                             objectives=[], slo="ttft:p99<=1000ms", quality_knobs=[])
    store.save_trial(rec.id, 0, optuna_trial_id=1, state="failed", flags=[f"--api-key={KEY}"], role="search", params={},
                     detail=f"ValueError: bad token {HF}", log_tail=f"args {{'api_key': '{KEY}'}}",
                     spec_hash="h")
    raw = (tmp_path / "s.db").read_bytes()
    assert KEY.encode() not in raw and HF.encode() not in raw
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("select fixed_flags from autotune_studies").fetchone()[0] == '["--api-key", "***"]'
