"""Two faults on the real vLLM CPU build, in one study (two vLLM launches, about a minute here):
its port is taken between autotune choosing it and vLLM binding it (vLLM's own `OSError: [Errno 98]
Address already in use`: retried on a new port, not a failed trial), and the retried candidate is a
configuration vLLM rejects at start (`--max-model-len 4096` above the demo model's 2048), recorded as
`bad_config`, not `crash`. The stand-in versions of both are in tests/integration/test_fault_matrix.py.
"""

from __future__ import annotations

import importlib.util
import socket
import sqlite3
from pathlib import Path

import pytest
import yaml

from autotune.cli import main

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (CPU build) is not installed")]


def test_port_taken_then_bad_config_on_the_real_cpu_build(tmp_path: Path, demo_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.tuner.trial as trial_module

    spec = {
        "name": "vllm-faults", "model": str(demo_model_dir),
        "engine": {"kind": "vllm", "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
                   "extra_flags": ["--dtype", "bfloat16", "--gpu-memory-utilization", "0.15", "--enforce-eager"],
                   "startup_timeout_s": 240},
        "search_space": {"params": {"max_model_len": {"type": "categorical", "choices": [512, 4096]},
                                    "max_num_seqs": {"type": "int", "low": 2, "high": 8}}},
        "baseline": {"max_model_len": 4096},   # above max_position_embeddings (2048): vLLM refuses it
        "workload": {"kind": "random", "input_len": 16, "output_len": 8},
        "slo": "ttft:p99<=2s",
        "objectives": ["output_tps", "p50_tpot_ms"],
        "load": {"mode": "fixed", "concurrency": 2, "num_requests": 8, "warmup": 0},
        "telemetry": {"source": "none"},
        "storage": f"sqlite:///{tmp_path}/vf.db",
    }
    path = tmp_path / "vf.yaml"
    path.write_text(yaml.safe_dump(spec))
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real = trial_module.find_free_port
    handed: list[int] = []

    def racy_free_port() -> int:
        handed.append(taken if not handed else real())
        return handed[-1]

    monkeypatch.setattr(trial_module, "find_free_port", racy_free_port)
    try:
        assert main(["run", "--study", str(path), "--n-trials", "1", "--no-progress"]) == 0
    finally:
        holder.close()
    with sqlite3.connect(tmp_path / "vf.db") as conn:
        (state, cause, detail, log_path), = conn.execute(
            "select state, cause, detail, log_path from autotune_trials").fetchall()
    assert len(handed) == 2 and handed[0] == taken
    log = Path(log_path).read_text()
    assert "OSError: [Errno 98] Address already in use" in log          # vLLM's own words, first launch
    assert (state, cause) == ("failed", "bad_config"), detail            # second launch: vLLM's config check
    assert "User-specified max_model_len (4096) is greater than the derived max_model_len" in detail
