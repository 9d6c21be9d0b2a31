"""The `cpu` source on a real process tree whose busy child appears after sampling starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from autotune.errors import UserError
from autotune.telemetry import TelemetryTarget, format_summary, get_source, objectives

# A parent that idles until the test writes a line, then starts a child that holds ~200 MiB and spins
# one core until the fixture kills the group.
TREE = r"""
import subprocess, sys
sys.stdin.readline()
child = subprocess.Popen([sys.executable, "-c",
    "b = bytearray(200 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nwhile True: pass"])
child.wait()
"""


@pytest.fixture
def tree() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True, stdin=subprocess.PIPE, text=True)
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass                                  # the test killed it already
    proc.wait()


def test_follows_children_that_appear_after_start(tree: subprocess.Popen, wait_until) -> None:
    sampler = get_source("cpu").sampler(TelemetryTarget(server_pid=tree.pid), hz=20)
    sampler.start()
    wait_until(lambda: sampler.series.seen >= 1, what="a first sample of the parent alone")
    tree.stdin.write("go\n")
    tree.stdin.flush()

    def child_seen() -> bool:     # its buffer counted, and it measured busy, over 20 samples or more
        rows = list(sampler.series.rows)
        return (len(rows) >= 20 and any(r["procs"] == 2 and r["rss_mib"] > 200 for r in rows)
                and any(r["procs"] == 2 and r.get("cpu_pct", 0) > 50 for r in rows))
    wait_until(child_seen, what=lambda: f"the busy child in the samples: {list(sampler.series.rows)[-5:]}")
    s = sampler.stop()
    assert s.source == "cpu" and s.samples >= 20
    assert max(r["procs"] for r in s.series) == 2 and s.series[0]["procs"] == 1
    assert s.rss_peak_mib is not None and s.rss_peak_mib > 200          # the child's buffer is counted
    # the spinning child is in the series; the mean over the whole run is only positive: the wait ends at the
    # first busy sample, so how many idle ones came before it is the machine's doing (seen: a mean of 7.5 %)
    assert max(r.get("cpu_pct", 0) for r in s.series if r["procs"] == 2) > 50
    assert s.cpu_pct_mean is not None and s.cpu_pct_mean > 0
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


def test_server_that_dies_mid_window(tree: subprocess.Popen, wait_until) -> None:
    sampler = get_source("cpu").sampler(TelemetryTarget(server_pid=tree.pid), hz=20)
    reads = []                                # the sampler's reads, counted
    read = sampler.probe.read
    sampler.probe.read = lambda t: reads.append(t) or read(t)
    sampler.start()
    wait_until(lambda: sampler.series.seen >= 3, what="three samples of the live process")
    os.killpg(tree.pid, signal.SIGKILL)
    tree.wait()
    after = len(reads)
    wait_until(lambda: len(reads) >= after + 2, what="two reads after the process died")
    s = sampler.stop()                        # no exception; what was read before the crash is kept
    assert s.samples >= 3 and s.rss_peak_mib is not None
