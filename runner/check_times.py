"""How long the run's checks took so far: the lifecycle records each check's seconds, and what chooses by a check's
cost reads them (``marker=auto``: ``strategies.auto_marker``)."""

from __future__ import annotations

import statistics
import threading
from typing import List, Optional


class CheckTimes:
    """The seconds of each check run so far (reused verdicts are no checks). Thread-safe: parallel checks record at
    once.

    Attributes:
        seconds: each check's seconds, in the order recorded.
    """

    def __init__(self) -> None:
        self.seconds: List[float] = []
        self._lock = threading.Lock()

    def record(self, seconds: Optional[float]) -> None:
        """Add one check's ``seconds`` (None: not measured here, e.g. replayed; ignored)."""
        if seconds is not None:
            with self._lock:
                self.seconds.append(float(seconds))

    def median(self) -> Optional[float]:
        """The median seconds of a check so far, or None before the first."""
        with self._lock:
            return statistics.median(self.seconds) if self.seconds else None
