"""Linear marker: walk down from the known hit one index at a time until the predicate fails.

Pure: no I/O, no ONNX, no logging. Each test removes exactly one element from the last
candidate that held, so it never relies on the predicate being monotone across more than one
step (Polygraphy's LinearMarker walks one layer at a time the same way).
"""

from __future__ import annotations

from typing import Optional

from strategies.boundary import BoundaryMarker


class LinearMarker(BoundaryMarker):
    """Tests ``hi - 1``, ``hi - 2``, ... until a miss; the boundary is the last hit."""

    def next(self) -> Optional[int]:
        """One below the last hit, or None when done."""
        if self.hi - 1 <= self.lo:
            return None
        return self.hi - 1

    def remaining(self) -> int:
        """Worst-case tests left."""
        return max(self.hi - self.lo - 1, 0)
