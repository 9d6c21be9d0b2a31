"""Arrival processes: closed loop (concurrency) and open loop (Poisson or gamma at a rate)."""

from autotune.bench.arrivals._base import Arrivals, Send
from autotune.bench.arrivals._closed import ClosedLoop
from autotune.bench.arrivals._open import OpenLoop

__all__ = ["Arrivals", "ClosedLoop", "OpenLoop", "Send"]
