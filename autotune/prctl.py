"""Linux process controls (prctl) the tuner sets on the processes it starts: the parent-death signal
(a server, a measurement worker) and the name `ps` shows. Kept apart from engine/ and node/ so that a
process importing it loads nothing else (a worker sets them before its imports)."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _prctl(option: int, value: int | bytes) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except OSError:        # not Linux: the caller simply lacks this guard
        pass


def parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Receive `sig` when the thread that started this process dies, and with it the tuner, even by
    SIGKILL. Linux only; elsewhere the child lacks this guard (kill_leftovers still covers servers)."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def set_name(name: str) -> None:
    """The process name `ps -o comm`, top and psutil's name() show (15 bytes at most)."""
    _prctl(_PR_SET_NAME, name.encode()[:15])
