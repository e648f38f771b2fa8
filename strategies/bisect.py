"""Bisect marker: binary search for the boundary of a monotone predicate over 0..count.

Pure: no I/O, no ONNX, no logging. Given that the predicate holds at ``count`` and not at 0,
it finds the smallest index where it holds in ceil(log2(count)) tests.

A round of ``k`` tests at once (parallel checks) is speculative execution of the serial search:
``k`` nodes of its decision tree (the midpoint, the midpoints of both halves, ..., widest gap
first), with the round's verdicts taken along the path the serial search would follow.
So the boundary is the serial one whatever the check does, monotone or not (a check whose
verdicts are not monotone in the index, such as a tolerance met by some prefixes and missed by
longer ones, still gets the serial answer, never one that depends on the number of workers);
``2**d - 1`` tests decide ``d`` serial steps in one round, the information of a ``2**d``-ary split.
Other counts cost a little: over every position of one needed node among 330 or 672, the set
search of ``mode=reduce`` took 0 to 7% more rounds on average than with a (k+1)-ary split (2, 4
and 8 workers), and some positions one or two more.
"""

from __future__ import annotations

import heapq
import math
from typing import Dict, List, Optional, Sequence, Tuple

from strategies.boundary import BoundaryMarker


class BisectMarker(BoundaryMarker):
    """Binary search between a known miss (``lo``) and a known hit (``hi``); see BoundaryMarker."""

    def next(self) -> Optional[int]:
        """The midpoint of the open gap, or None when ``hi`` is the boundary."""
        return _midpoint(self.lo, self.hi)

    def _propose(self, k: int) -> List[int]:
        """``k`` tests of the serial search's decision tree from (lo, hi): its midpoint first, then
        always the midpoint of the widest gap the tests taken so far leave (the gap the serial path
        most likely enters, with the boundary anywhere in it alike; ties in breadth-first order);
        fewer when the tree is smaller (every index of a gap of ``k`` or fewer). Widest first
        rather than level by level: on 330 indices 4 workers need at most 4 rounds, as a 5-ary
        split does (5 level by level)."""
        probes: List[int] = []
        gaps: List[Tuple[int, int, int, int]] = [(self.lo - self.hi, 0, self.lo, self.hi)]  # (-width, order, lo, hi)
        order = 0
        while gaps and len(probes) < k:
            _, _, lo, hi = heapq.heappop(gaps)
            mid = _midpoint(lo, hi)
            if mid is not None:
                probes.append(mid)
                for a, b in ((lo, mid), (mid, hi)):
                    order += 1
                    heapq.heappush(gaps, (a - b, order, a, b))
        return probes

    def step_round(self, verdicts: Sequence[Tuple[int, Optional[bool]]]) -> None:
        """Take a round's verdicts, ``(index, hit)``, along the serial search's path: from the
        midpoint, each verdict picks the half whose midpoint is the next test, until that test was
        not in the round or its verdict is missing (None: cancelled). Verdicts off the path are
        ignored, as the serial search never made those tests."""
        known: Dict[int, Optional[bool]] = dict(verdicts)
        while (index := self.next()) is not None and known.get(index) is not None:
            self.step(index, bool(known[index]))

    def settled(self, verdicts: Sequence[Tuple[int, Optional[bool]]]) -> bool:
        """True when the verdicts known so far (None: still running) lead the serial path out of
        the round: every check still running is off the path and can be cancelled."""
        known: Dict[int, Optional[bool]] = dict(verdicts)
        lo, hi = self.lo, self.hi
        while (mid := _midpoint(lo, hi)) is not None and mid in known:
            hit = known[mid]
            if hit is None:
                return False
            lo, hi = (lo, mid) if hit else (mid, hi)
        return True

    def remaining(self) -> int:
        """Tests left: ceil(log2(hi - lo))."""
        gap = self.hi - self.lo
        return math.ceil(math.log2(gap)) if gap > 1 else 0


def _midpoint(lo: int, hi: int) -> Optional[int]:
    """The serial search's test in the open gap (lo, hi), or None when the gap holds no index."""
    return (lo + hi) // 2 if hi - lo > 1 else None
