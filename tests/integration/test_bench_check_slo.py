"""`autotune bench --check-slo` (what the deploy kit's smoke test relies on): its exit code says whether
the run met the SLO, against the mock server over real HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from autotune.engine.process import find_free_port, stop_group

REPO = Path(__file__).resolve().parents[2]


def _bench(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "bench", "--url", url, "--model", "mock",
                           "--workload", "random:input_len=16,output_len=8", "--concurrency", "2",
                           "--num-requests", "6", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_check_slo_exit_code_follows_the_slo() -> None:
    port = find_free_port()
    server = subprocess.Popen([sys.executable, "-m", "autotune.bench.mockserver", "--port", str(port), "--mode",
                               "stream", "--itl-ms", "1"], cwd=REPO, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):                  # up to a minute for the server to answer
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        ok = _bench(url, "--slo", "ttft:p99<=10s", "--check-slo")
        assert ok.returncode == 0 and "SLO check: passed (ttft:p99<=10000ms)" in ok.stdout, ok.stdout + ok.stderr
        broken = _bench(url, "--slo", "ttft:p99<=0.001ms", "--check-slo")
        assert broken.returncode == 1 and "SLO check: FAILED (slo:ttft:p99 over by" in broken.stdout
        missing = _bench(url, "--check-slo")
        assert missing.returncode == 2 and "--check-slo needs --slo" in missing.stderr
    finally:
        stop_group(server.pid, server.pid, grace_s=5.0, popen=server)
