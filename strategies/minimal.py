"""Minimal marker: galloping (exponential) search, for set searches over a ranked order.

Pure: no I/O, no ONNX, no logging. Tests 1, 2, 4, 8, ... until the predicate holds, then
bisects the last gap (Bentley & Yao 1976, "unbounded search"): 2*ceil(log2(b)) tests for a
boundary at ``b``, so a good ranking that puts the needed elements first costs few tests.
Modes use it inside ``SetSearch`` (``searches_sets``) to find a 1-minimal set.
"""
from __future__ import annotations

import math
from typing import Optional


class MinimalMarker:
    """Galloping boundary search over 0..count.

    Args:
        count: the predicate is known to hold at ``count`` and assumed not to hold at 0.
    """

    searches_sets = True

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.lo = 0
        self.hi = count
        self._galloping = True

    def next(self) -> Optional[int]:
        """The next index to test, or None when ``hi`` is the boundary."""
        if self.hi - self.lo <= 1:
            return None
        if self._galloping:
            probe = max(1, 2 * self.lo)
            if probe < self.hi:
                return probe
            self._galloping = False
        return (self.lo + self.hi) // 2

    def step(self, index: int, hit: bool) -> None:
        """Record whether the predicate held at ``index``; the first hit ends the gallop."""
        if hit:
            self.hi = min(self.hi, index)
            self._galloping = False
        else:
            self.lo = max(self.lo, index)

    @property
    def boundary(self) -> int:
        """The smallest index known to hold."""
        return self.hi

    def remaining(self) -> int:
        """Tests left, assuming the gallop ends at once."""
        gap = self.hi - self.lo
        return math.ceil(math.log2(gap)) if gap > 1 else 0
