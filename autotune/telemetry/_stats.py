"""Bounded accumulators shared by every source.

A trial can load a server for hours at 10 Hz, so nothing here grows with the run: the summary comes
from running sums and extremes over every sample, and the raw series is a decimating buffer that
keeps an evenly spaced subset of the whole window (not just its tail, which a ring would keep).
"""

from __future__ import annotations

from typing import Any


class RunningStats:
    """Count, sum, min and max per key, over every value added (None means "not read" and is skipped)."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}
        self._sum: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._min: dict[str, float] = {}

    def add(self, key: str, value: float | None) -> None:
        if value is None:
            return
        v = float(value)
        if key in self._n:
            self._n[key] += 1
            self._sum[key] += v
            self._max[key] = max(self._max[key], v)
            self._min[key] = min(self._min[key], v)
        else:
            self._n[key], self._sum[key], self._max[key], self._min[key] = 1, v, v, v

    def count(self, key: str) -> int:
        return self._n.get(key, 0)

    def mean(self, key: str) -> float | None:
        n = self._n.get(key, 0)
        return self._sum[key] / n if n else None

    def max(self, key: str) -> float | None:
        return self._max.get(key)

    def min(self, key: str) -> float | None:
        return self._min.get(key)


class SeriesBuffer:
    """Keeps at most `capacity` rows spread evenly over the whole run.

    When full, every other kept row is dropped and the stride doubles, so memory stays bounded and
    the kept rows still span start to end (the idle-to-load transition stays visible).
    """

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self.rows: list[dict[str, Any]] = []
        self._stride = 1
        self._seen = 0

    def append(self, row: dict[str, Any]) -> None:
        if self._seen % self._stride == 0:
            self.rows.append(row)
            if len(self.rows) >= self.capacity:
                self.rows = self.rows[::2]
                self._stride *= 2
        self._seen += 1

    @property
    def seen(self) -> int:
        return self._seen


def decimate(rows: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """Evenly thin `rows` to at most `max_points`, always keeping the first and last row."""
    n = len(rows)
    if n <= max_points:
        return list(rows)
    if max_points <= 1:
        return rows[:max_points]
    step = (n - 1) / (max_points - 1)
    return [rows[round(i * step)] for i in range(max_points)]
