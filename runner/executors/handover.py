"""When ``executor=processes`` hands its checks from the runner to its worker processes.

With ``local_start`` the checks run in the runner's threads while the workers start. Once they
are ready, handing over costs the runner about a second of its interpreter (importing Dask,
connecting, sending the checker and a warm-up check to each worker) and each worker a first check
of the model: on an H100, a cheap precision run whose workers were ready with five checks left
ran 1.1 to 1.2x serial where threads alone ran 0.8 to 1.0x. ``HandOver`` keeps the checks here
when the strategy's estimate of the checks left, at the pace the checks run here, ends sooner
than ``cost_s``; it hands over at once when the estimate is unknown, when the workers are ready
before anything was checked here, or when other work asks for them (precision's ranking,
``Executor.spread``).
"""

from __future__ import annotations

import logging
import statistics
import threading
from typing import List, Optional

log = logging.getLogger(__name__)


class HandOver:
    """The decision to connect to the ready workers.

    Args:
        lanes: checks at once here (the executor's slots).
        cost_s: seconds the hand-over is taken to cost (see the module docstring).

    Attributes:
        wanted: set once the workers should be used; the executor connects after it.
    """

    def __init__(self, lanes: int, cost_s: float = 2.0):
        self.lanes, self.cost_s = max(1, lanes), cost_s
        self.wanted = threading.Event()
        self._checks_s: List[float] = []  # the checks run here so far, seconds each
        self._said = False

    def checked_here(self, seconds: float) -> None:
        """Note a check that ran here and took ``seconds``."""
        self._checks_s.append(seconds)

    def want(self) -> None:
        """Use the workers from now on."""
        self.wanted.set()

    def ready(self) -> None:
        """The workers are ready: hand over at once if no check here has ended yet (none started,
        or they have run the whole start-up long); else the next ``expect`` decides."""
        if not self._checks_s:
            self.want()

    def expect(self, remaining: Optional[int], ready: bool) -> None:
        """Take the strategy's estimate of the checks still to come (None: unknown) before a round;
        ``ready``: the workers could be connected now. Sets ``wanted`` unless the checks left,
        run here ``lanes`` at a time at the median pace of the checks run here so far, end within
        ``cost_s`` seconds."""
        if self.wanted.is_set():
            return
        if remaining is None or (ready and not self._checks_s):
            self.want()
            return
        if not self._checks_s:
            return  # no pace to judge by yet, and nothing to connect to
        left_s = remaining * statistics.median(self._checks_s) / self.lanes
        if left_s > self.cost_s:
            self.want()
        elif ready and not self._said:
            self._said = True
            log.info(
                "The workers are ready, but the %d checks left would take about %.1f s here, less than handing "
                "them over costs: they run here",
                remaining,
                left_s,
            )
