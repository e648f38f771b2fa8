"""Bisect marker: binary search for the boundary of a monotone predicate over 0..count.

Pure: no I/O, no ONNX, no logging. Given that the predicate holds at ``count`` and not at 0,
it finds the smallest index where it holds in ceil(log2(count)) tests.
"""

from __future__ import annotations

import math
from typing import List, Optional

from strategies.boundary import BoundaryMarker


class BisectMarker(BoundaryMarker):
    """Binary search between a known miss (``lo``) and a known hit (``hi``); see BoundaryMarker."""

    def next(self) -> Optional[int]:
        """The midpoint of the open gap, or None when ``hi`` is the boundary."""
        if self.hi - self.lo <= 1:
            return None
        return (self.lo + self.hi) // 2

    def _propose(self, k: int) -> List[int]:
        """``k`` indices splitting the open gap into ``k + 1`` near-equal parts (a (k+1)-ary search:
        ceil(log_{k+1}(count)) rounds); every index of the gap when it holds ``k`` or fewer."""
        return self._split(k)

    def remaining(self) -> int:
        """Tests left: ceil(log2(hi - lo))."""
        gap = self.hi - self.lo
        return math.ceil(math.log2(gap)) if gap > 1 else 0
