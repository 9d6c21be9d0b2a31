"""A converted, bursty trace replayed against the real vLLM CPU build (the shared session server) with
`autotune bench`: the send-time error is measured and bounded, and with `--lengths-only` no text of the
source log reaches the converted file, the printed result or the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.bench.trace.command import main as convert

pytestmark = pytest.mark.vllm

MARKER = "WOMBAT-CONFIDENTIAL-0923"
# The bound (tests/conftest.py): p99 send error under half the trace's median gap (50 ms here). The
# server runs on the same two cores as the client and takes them both while it generates: the hard case.


def gateway_log(path: Path) -> Path:
    """Four bursts of six chat requests, 50 ms apart inside a burst, 1.5 s between bursts; every prompt
    carries the marker and starts with the same system prompt."""
    lines = []
    for b in range(4):
        for k in range(6):
            lines.append({"timestamp": 1748772000.0 + 1.5 * b + 0.05 * k, "user": MARKER, "request": {
                "model": "m", "max_tokens": 8, "messages": [
                    {"role": "system", "content": f"You are the {MARKER} assistant of the server team."},
                    {"role": "user", "content": f"request {b}.{k}: {MARKER} asks about the cache"}]},
                "response": {"choices": [{"message": {"content": f"{MARKER} says no"}}],
                             "usage": {"prompt_tokens": 30, "completion_tokens": 8}}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


async def test_bursty_trace_replays_on_schedule_and_keeps_text_private(vllm_server, tmp_path: Path,
                                                                       replay_on_schedule) -> None:
    trace, result = tmp_path / "trace.jsonl", tmp_path / "bench.json"
    assert convert([str(gateway_log(tmp_path / "log.jsonl")), "-o", str(trace), "--tokenizer", vllm_server.model,
                    "--lengths-only"]) == 0
    # The client shares two cores with vLLM and the other work on this machine: replay_on_schedule
    # (conftest) holds the bound on a replay the machine did not starve, and a replay beyond it flagged.

    async def replay():
        proc = subprocess.run([sys.executable, "-m", "autotune", "bench", "--url", vllm_server.url, "--model",
                               vllm_server.model, "--endpoint", "chat", "--workload", f"trace:path={trace}",
                               "--slo", "ttft=30s", "--json", str(result)], capture_output=True, text=True,
                              timeout=240)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(result.read_text())
        assert doc["completed"] == 24 and doc["failed"] == 0 and doc["total_output_tokens"] == 24 * 8
        assert doc["median_send_gap_ms"] == pytest.approx(50.0, abs=1.0)
        print(f"send drift on the CPU build: p50 {doc['median_send_drift_ms']:.2f} ms, p99 "
              f"{doc['p99_send_drift_ms']:.2f} ms, max {doc['max_send_drift_ms']:.2f} ms against 50 ms gaps; "
              f"client: {doc['client']}")
        assert "P99 send drift (ms):" in proc.stdout and "workload: 24 requests" in proc.stdout
        assert doc["workload_profile"]["prefix_share_pct"] > 20      # the shared system prompt survived
        for artefact in (result.read_text(), proc.stdout, proc.stderr):
            assert MARKER not in artefact and "WOMBAT" not in artefact
        return doc, doc["client"]

    text = trace.read_text()
    assert MARKER not in text and "WOMBAT" not in text
    await replay_on_schedule(replay)
