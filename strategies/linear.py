"""Linear marker: walk down from the known hit one index at a time until the predicate fails.

Pure: no I/O, no ONNX, no logging. Each test removes exactly one element from the last
candidate that held, so it never relies on the predicate being monotone across more than one
step (Polygraphy's LinearMarker walks one layer at a time the same way).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from strategies.boundary import BoundaryMarker, known_before


class LinearMarker(BoundaryMarker):
    """Tests ``hi - 1``, ``hi - 2``, ... until a miss; the boundary is the last hit."""

    def next(self) -> Optional[int]:
        """One below the last hit, or None when done."""
        if self.hi - 1 <= self.lo:
            return None
        return self.hi - 1

    def _propose(self, k: int) -> List[int]:
        """``hi - 1``, ``hi - 2``, ... ``k`` at once (stopping above ``lo``)."""
        return list(range(self.hi - 1, max(self.lo, self.hi - 1 - k), -1))

    def step_round(self, verdicts: Sequence[Tuple[int, Optional[bool]]]) -> None:
        """Take the verdicts top down as a serial walk would, up to the first miss; the verdicts
        below it were speculative and are ignored, so the answer is the serial one even when the
        predicate is not monotone. A missing verdict (None) ends what can be taken."""
        for index, hit in verdicts:
            if hit is None:
                return
            self.step(index, hit)
            if not hit:
                return

    def settled(self, verdicts: Sequence[Tuple[int, Optional[bool]]]) -> bool:
        """True once a miss is known with every verdict above it: the checks below it are moot."""
        return known_before([hit for _, hit in verdicts], False)

    def remaining(self) -> int:
        """Worst-case tests left."""
        return max(self.hi - self.lo - 1, 0)
