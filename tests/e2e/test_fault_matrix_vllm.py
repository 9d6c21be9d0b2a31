"""Two faults on the real vLLM CPU build, in one study (two vLLM launches, about a minute here):
its port is taken between autotune choosing it and vLLM binding it (vLLM's own `OSError: [Errno 98]
Address already in use`: retried on a new port, not a failed trial), and the retried candidate is a
configuration vLLM rejects at start (`--max-model-len 4096` above the demo model's 2048), recorded as
`bad_config`, not `crash`. The stand-in versions of both are in tests/integration/test_fault_matrix.py.
"""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (CPU build) is not installed")]


def test_port_taken_then_bad_config_on_the_real_cpu_build(tmp_path: Path, demo_model_dir: Path,
                                                         taken_port_first: Any) -> None:
    spec = {
        "name": "vllm-faults", "model": str(demo_model_dir),
        "engine": {"kind": "vllm", "command": ["{python}", "-m", "vllm.entrypoints.openai.api_server"],
                   "extra_flags": ["--dtype", "bfloat16", "--gpu-memory-utilization", "0.15", "--enforce-eager"],
                   "startup_timeout_s": 600},
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
    assert main(["run", "--study", str(path), "--n-trials", "1", "--no-progress"]) == 0
    with sqlite3.connect(tmp_path / "vf.db") as conn:
        (state, cause, detail, log_path), = conn.execute(
            "select state, cause, detail, log_path from autotune_trials").fetchall()
    assert len(taken_port_first.handed) == 2 and taken_port_first.handed[0] == taken_port_first.port
    log = Path(log_path).read_text()
    assert "OSError: [Errno 98] Address already in use" in log          # vLLM's own words, first launch
    assert (state, cause) == ("failed", "bad_config"), detail            # second launch: vLLM's config check
    assert "User-specified max_model_len (4096) is greater than the derived max_model_len" in detail
