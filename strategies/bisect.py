"""Bisect marker: binary search for the boundary of a monotone predicate over 0..count.

Pure: no I/O, no ONNX, no logging. Given that the predicate holds at ``count`` and not at 0,
it finds the smallest index where it holds in ceil(log2(count)) steps.
"""
from __future__ import annotations

import math
from typing import Optional


class BisectMarker:
    """Binary search between a known miss (``lo``) and a known hit (``hi``).

    Args:
        count: the predicate is known to hold at ``count`` and assumed not to hold at 0.

    Attributes:
        lo: largest index known not to hold.
        hi: smallest index known to hold (the boundary, once ``next()`` returns None).
    """

    #: whether a mode should use this marker for a set search (see strategies/minimal.py)
    searches_sets = False

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.lo = 0
        self.hi = count

    def next(self) -> Optional[int]:
        """The next index to test, or None when ``hi`` is the boundary."""
        if self.hi - self.lo <= 1:
            return None
        return (self.lo + self.hi) // 2

    def step(self, index: int, hit: bool) -> None:
        """Record whether the predicate held at ``index``."""
        if hit:
            self.hi = min(self.hi, index)
        else:
            self.lo = max(self.lo, index)

    @property
    def boundary(self) -> int:
        """The smallest index known to hold."""
        return self.hi

    def remaining(self) -> int:
        """Tests left: ceil(log2(hi - lo))."""
        gap = self.hi - self.lo
        return math.ceil(math.log2(gap)) if gap > 1 else 0
