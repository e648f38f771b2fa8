"""Linear marker: walk down from the known hit one index at a time until the predicate fails.

Pure: no I/O, no ONNX, no logging. Each test removes exactly one element from the last
candidate that held, so it never relies on the predicate being monotone across more than one
step (Polygraphy's LinearMarker walks the same way).
"""
from __future__ import annotations

from typing import Optional


class LinearMarker:
    """Tests ``hi - 1``, ``hi - 2``, ... until a miss; the boundary is the last hit.

    Args:
        count: the predicate is known to hold at ``count`` and assumed not to hold at 0.
    """

    searches_sets = False

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.lo = 0
        self.hi = count

    def next(self) -> Optional[int]:
        """The next index to test (one below the last hit), or None when done."""
        if self.hi - 1 <= self.lo:
            return None
        return self.hi - 1

    def step(self, index: int, hit: bool) -> None:
        """Record whether the predicate held at ``index``; a miss ends the walk."""
        if hit:
            self.hi = min(self.hi, index)
        else:
            self.lo = max(self.lo, index)

    @property
    def boundary(self) -> int:
        """The smallest index known to hold."""
        return self.hi

    def remaining(self) -> int:
        """Worst-case tests left."""
        return max(self.hi - self.lo - 1, 0)
