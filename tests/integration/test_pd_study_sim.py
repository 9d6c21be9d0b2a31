"""A PD split measured as a study's candidate (issue 26) on the simulator: `autotune run` launches the
enqueued 1p1d as prefill and decode sim-serve processes behind autotune's router, measures it through
the router like any layout, records it with one log per process, leaves no process behind, and exports it as the commands that start
it (a one-server format is refused for it)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from autotune import causes
from autotune.cli import main

pytestmark = pytest.mark.study     # whole studies in their own processes (make test-fast skips them)

SPACE = {"params": {
    "max_num_seqs": {"type": "int", "low": 8, "high": 64, "log": True},
    "parallel_layout": {"type": "categorical", "default": "tp1", "requires_gpus": 2,
                        "choices": {"tp1": {}, "1p1d": {"pd_prefill": 1, "pd_decode": 1}}},
    "pd_kv_buffer_device": {"type": "categorical", "choices": ["cuda", "cpu"], "default": "cuda",
                            "requires_gpus": 2, "when": {"parallel_layout": ["1p1d"]}}}}


def test_a_split_is_launched_measured_stopped_and_exported(autotune_run, servers_in, sim_spec, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    spec = sim_spec("pd", engine={"num_gpus": 2}, search_space=SPACE, confirm={"enabled": False},
                    load={"max_steps": 2, "requests_per_step": 24},
                    enqueue=[{"parallel_layout": "1p1d", "pd_kv_buffer_device": "cuda", "max_num_seqs": 32}])
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "2", "--no-progress"], tmp_path)
    assert run.finish(300) == 0, "\n".join(run.lines)
    with sqlite3.connect(tmp_path / "pd.db") as conn:
        rows = conn.execute("select number, state, cause, params, log_path, metrics from autotune_trials "
                            "order by number").fetchall()
    split = [r for r in rows if json.loads(r[3]).get("parallel_layout") == "1p1d"]
    assert len(split) == 1, rows
    number, state, cause, _, log_path, metrics = split[0]
    assert state == "ok" and cause in (None, causes.CLIENT_SATURATED), rows   # (a loaded machine's client)
    assert json.loads(metrics)["completed"] > 0
    log = Path(log_path)
    assert "Starting router on" in log.read_text()
    stem = log.stem
    assert (log.parent / f"{stem}.prefill-0.log").is_file() and (log.parent / f"{stem}.decode-0.log").is_file()
    assert "'kv_transfer_config': {'kv_connector': 'NixlConnector'" in (log.parent / f"{stem}.decode-0.log").read_text()
    assert not servers_in(tmp_path, "sim-serve") and not servers_in(tmp_path, "autotune router")
    # the export writes the split's launch (instances with their connector config, then the router) ...
    storage = f"sqlite:///{tmp_path}/pd.db"
    assert main(["export", "--storage", storage, "--format", "command", "--trial", str(number), "--accept-flagged", "-o", "-"]) == 0
    text = capsys.readouterr().out
    prefill, decode, router = [line for line in text.splitlines() if not line.startswith("#")]
    assert prefill.startswith("CUDA_VISIBLE_DEVICES=0 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 vllm serve llama-3.1-8b")
    assert decode.startswith("CUDA_VISIBLE_DEVICES=1 ") and "--port 8200 --kv-transfer-config" in decode
    assert "--pd-" not in text and "NixlConnector" in decode
    assert router == "autotune router --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200"
    # ... and refuses a one-server format for it, in one line
    assert main(["export", "--storage", storage, "--format", "vllm-yaml", "--trial", str(number), "--accept-flagged", "-o", "-"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]     # (after the flagged trial's warning)
    assert err.startswith(f"autotune: error: trial {number} is a prefill/decode split (1p1d): ")


def test_a_split_instance_killed_under_load_fails_its_trial_by_name(autotune_run, servers_in, sim_spec,
                                                                     tmp_path: Path) -> None:
    """The decode instance's PID is killed while the split is measured: the trial fails, its detail names
    that instance, the study goes on, and no process of the split is left."""
    spec = sim_spec("pdkill", engine={"num_gpus": 2, "time_scale": 10}, search_space=SPACE,
                    confirm={"enabled": False}, load={"max_steps": 3, "requests_per_step": 40},
                    enqueue=[{"parallel_layout": "1p1d", "pd_kv_buffer_device": "cuda", "max_num_seqs": 32}])
    run = autotune_run(["run", "--study", str(spec), "--n-trials", "2", "--no-progress"], tmp_path)
    run.wait_for(lambda ls: any(l.startswith("[trial 1]") for l in ls) and "capacity search" in ls[-1], 180)
    header = next((tmp_path / "pdkill-logs").glob("trial-0001.decode-0.log")).read_text().splitlines()[0]
    port = header.split("(port ")[1].split(")")[0]
    victim = next(p for p in servers_in(tmp_path, "sim-serve") if f"--port {port} " in " ".join(p.cmdline()))
    victim.kill()
    assert run.finish(300) == 0, "\n".join(run.lines)
    with sqlite3.connect(tmp_path / "pdkill.db") as conn:
        state, detail = conn.execute("select state, detail from autotune_trials where number = 1").fetchone()
    assert state == "failed" and detail.startswith(f"decode instance 0 (port {port}) exited: "), detail
    assert not servers_in(tmp_path, "sim-serve") and not servers_in(tmp_path, "autotune router")
