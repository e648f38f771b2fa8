"""How long the run's checks took so far, and what a candidate costs whole: the lifecycle records each check's
seconds and each round's wall from asking for its candidates to sorting them (building, writing, checking,
sorting), and what chooses by a candidate's cost reads them (``marker=auto``: ``strategies.auto_marker``)."""

from __future__ import annotations

import statistics
import threading
from typing import List, Optional


class CheckTimes:
    """The seconds of each check run so far (reused verdicts are no checks). Thread-safe: parallel checks record at
    once.

    Attributes:
        seconds: each check's seconds, in the order recorded.
        candidates: each checked candidate's whole seconds (its round's wall over the checks it ran).
    """

    def __init__(self) -> None:
        self.seconds: List[float] = []
        self.candidates: List[float] = []
        self._lock = threading.Lock()

    def record_round(self, seconds: float, checks: int) -> None:
        """Add a round's wall ``seconds`` (building, writing, checking and sorting its candidates) over the
        ``checks`` it ran; a round that ran none (every verdict reused) is no measure and is ignored."""
        if checks > 0:
            with self._lock:
                self.candidates.extend([float(seconds) / checks] * checks)

    def candidate_median(self) -> Optional[float]:
        """The median whole seconds of a candidate so far, or None before the first round that checked one."""
        with self._lock:
            return statistics.median(self.candidates) if self.candidates else None

    def record(self, seconds: Optional[float]) -> None:
        """Add one check's ``seconds`` (None: not measured here, e.g. replayed; ignored)."""
        if seconds is not None:
            with self._lock:
                self.seconds.append(float(seconds))

    def median(self) -> Optional[float]:
        """The median seconds of a check so far, or None before the first."""
        with self._lock:
            return statistics.median(self.seconds) if self.seconds else None
