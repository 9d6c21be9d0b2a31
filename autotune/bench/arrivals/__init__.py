"""Arrival processes: closed loop (concurrency), open loop (Poisson or gamma at a rate), and a trace's
recorded times (replay)."""

from autotune.bench.arrivals._base import Arrivals, Send
from autotune.bench.arrivals._closed import ClosedLoop
from autotune.bench.arrivals._open import OpenLoop
from autotune.bench.arrivals._trace import TraceReplay

__all__ = ["Arrivals", "ClosedLoop", "OpenLoop", "Send", "TraceReplay"]
