"""Minimal marker: galloping (exponential) search, for set searches over a ranked order.

Pure: no I/O, no ONNX, no logging. Tests 1, 2, 4, 8, ... until the predicate holds, then
bisects the last gap (Bentley & Yao 1976, "an almost optimal algorithm for unbounded
searching"): about 2*log2(b) tests for a boundary at ``b``, so a ranking that puts the
needed elements first costs few tests. Modes use it inside ``SetSearch`` (``searches_sets``)
to find a 1-minimal set.
"""

from __future__ import annotations

import math
from typing import List, Optional

from strategies.boundary import BoundaryMarker


class MinimalMarker(BoundaryMarker):
    """Galloping boundary search over 0..count; see BoundaryMarker."""

    searches_sets = True

    def __init__(self, count: int):
        super().__init__(count)
        self._galloping = True

    def next(self) -> Optional[int]:
        """Double while galloping, then bisect; None when ``hi`` is the boundary."""
        if self.hi - self.lo <= 1:
            return None
        if self._galloping:
            probe = max(1, 2 * self.lo)
            if probe < self.hi:
                return probe
            self._galloping = False
        return (self.lo + self.hi) // 2

    def step(self, index: int, hit: bool) -> None:
        """Record the test; the first hit ends the gallop."""
        super().step(index, hit)
        if hit:
            self._galloping = False

    def _propose(self, k: int) -> List[int]:
        """While galloping, the next ``k`` doublings below ``hi``; then ``k`` indices splitting the
        gap (``_split``)."""
        if self.hi - self.lo <= 1:
            return []
        if self._galloping:
            probes: List[int] = []
            probe = max(1, 2 * self.lo)
            while probe < self.hi and len(probes) < k:
                probes.append(probe)
                probe *= 2
            if probes:
                return probes
            self._galloping = False
        return self._split(k)

    def remaining(self) -> int:
        """Tests left, assuming the gallop ends at once."""
        gap = self.hi - self.lo
        return math.ceil(math.log2(gap)) if gap > 1 else 0
