"""The `cpu` source on a real process tree whose busy child appears after sampling starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from autotune.errors import UserError
from autotune.telemetry import TelemetryTarget, format_summary, get_source, objectives

# A parent that idles and, after 0.3 s, starts a child that holds ~200 MiB and spins one core.
TREE = r"""
import subprocess, sys, time
time.sleep(0.3)
child = subprocess.Popen([sys.executable, "-c",
    "b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    "import time\nt = time.time()\nwhile time.time() - t < 30: pass"])
child.wait()
"""


@pytest.fixture
def tree() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass                                  # the test killed it already
    proc.wait()


def test_follows_children_that_appear_after_start(tree: subprocess.Popen) -> None:
    sampler = get_source("cpu").sampler(TelemetryTarget(server_pid=tree.pid), hz=20)
    sampler.start()
    time.sleep(1.6)
    s = sampler.stop()
    assert s.source == "cpu" and s.samples >= 20
    assert max(r["procs"] for r in s.series) == 2 and s.series[0]["procs"] == 1
    assert s.rss_peak_mib is not None and s.rss_peak_mib > 200          # the child's buffer is counted
    assert s.cpu_pct_mean is not None and s.cpu_pct_mean > 15           # one spinning core, on a shared host
    busy = [r["cpu_pct"] for r in s.series if r.get("procs") == 2 and "cpu_pct" in r]
    assert max(busy) > 50
    assert s.mem_total_mib == pytest.approx(psutil.virtual_memory().total / 2**20, rel=1e-3)
    assert s.peak_mem_used_mib == s.rss_peak_mib and 0 < s.mem_headroom < 1
    assert s.mean_power_w is None and "power_w" in s.unsupported
    assert "tokens_per_joule" not in objectives(s, 100, 1.0, 1, 100.0)
    assert format_summary(s).startswith("CPU ")


def test_server_that_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(UserError, match="is not running"):
        get_source("cpu").sampler(TelemetryTarget(server_pid=proc.pid)).start()


def test_server_that_dies_mid_window(tree: subprocess.Popen) -> None:
    sampler = get_source("cpu").sampler(TelemetryTarget(server_pid=tree.pid), hz=20)
    sampler.start()
    time.sleep(0.3)
    os.killpg(tree.pid, signal.SIGKILL)
    tree.wait()
    time.sleep(0.3)
    s = sampler.stop()                        # no exception; what was read before the crash is kept
    assert s.samples >= 3 and s.rss_peak_mib is not None
