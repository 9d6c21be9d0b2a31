"""Longest shared prefix with any earlier request, for the prefix-sharing share and for `--lengths-only`.

Prefixes are indexed at every BLOCK units (vLLM's KV-cache block on GPUs is 16 tokens, and a prefix
cache hits whole blocks only), by a chained hash, so the index costs one entry per block; the match is
then extended unit by unit against the one earlier request found.
"""

from __future__ import annotations

from array import array
from typing import Sequence

BLOCK = 16


class PrefixIndex:
    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self._seen: dict[int, int] = {}            # chained hash of a block-aligned prefix -> request index
        self._units: list[array] = []            # kept compact: 8 bytes a unit

    def add(self, units: Sequence[int]) -> tuple[int | None, int]:
        """Index `units` (token ids, and negative ids for message separators) as the next request; return the
        earlier request it shares the longest prefix with (None when none shares a whole block) and the
        length of that prefix in units."""
        b = self.block
        h, best, matched = 0, None, 0
        hashes = []
        for k in range(len(units) // b):
            h = hash((h, tuple(units[k * b:(k + 1) * b])))
            hashes.append(h)
        for k, hk in enumerate(hashes):
            j = self._seen.get(hk)
            if j is None:
                break
            best, matched = j, (k + 1) * b
        if best is not None:
            other = self._units[best]
            while matched < len(units) and matched < len(other) and units[matched] == other[matched]:
                matched += 1
        index = len(self._units)
        self._units.append(array("q", units))
        for hk in hashes:
            self._seen.setdefault(hk, index)
        return best, matched


def shared_prefix_share(sequences: Sequence[Sequence[int]], block: int = BLOCK) -> float:
    """Fraction of all units that repeat a prefix of an earlier sequence, counted in whole blocks (what
    a prefix cache of that block size could serve if it kept everything)."""
    index = PrefixIndex(block)
    total = shared = 0
    for units in sequences:
        _, n = index.add(units)
        total += len(units)
        shared += (n // block) * block
    return shared / total if total else 0.0
