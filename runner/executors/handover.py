"""When ``executor=processes`` hands its checks from the runner to its worker processes.

With ``local_start`` the checks run in the runner's threads while the workers start. Once they
are ready, handing over costs the runner about a second of its interpreter (importing Dask,
connecting, sending the checker and a warm-up check to each worker) and each worker a first check
of the model: on an H100, a cheap precision run whose workers were ready with five checks left
ran 1.1 to 1.2x serial where threads alone ran 0.8 to 1.0x, and one handed over with about 2 s
left here took 9.4 s where the two that kept their checks took 6.8 and 6.9 s (hence 3 s).
``HandOver`` keeps the checks here when the strategy's estimate of the checks left, at the pace
the checks run here, ends sooner than ``cost_s``; it hands over at once when the estimate is
unknown, when the workers are ready before anything was checked here, or when other work asks
for them (precision's ranking, ``Executor.spread``). It decides once the workers are ready.
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

    def __init__(self, lanes: int, cost_s: float = 3.0):
        self.lanes, self.cost_s = max(1, lanes), cost_s
        self.wanted = threading.Event()
        self._checks_s: List[float] = []  # the checks run here so far, seconds each
        self._remaining: Optional[int] = None  # the strategy's latest estimate of the checks left
        self._ready = False
        self._said = False

    def checked_here(self, seconds: float) -> None:
        """Note a check that ran here and took ``seconds``."""
        self._checks_s.append(seconds)

    def want(self) -> None:
        """Use the workers from now on."""
        self.wanted.set()

    def ready(self) -> None:
        """The workers are ready: decide with the latest estimate (``expect``); with no check
        ended here yet (none started, or they ran the whole start-up long), hand over."""
        self._ready = True
        self._decide()

    def expect(self, remaining: Optional[int], ready: bool) -> None:
        """Take the strategy's estimate of the checks still to come (None: unknown) before a round;
        ``ready``: the workers could be connected now. The decision waits for the workers: until
        they are ready the estimate is only kept (early in a search many checks are left, and
        few may be by the time the workers are up)."""
        self._remaining = remaining
        self._ready = self._ready or ready
        if self._ready:
            self._decide()

    def _decide(self) -> None:
        """Set ``wanted`` unless the checks left, run here ``lanes`` at a time at the median pace of
        the checks run here so far, end within ``cost_s`` seconds."""
        if self.wanted.is_set():
            return
        if self._remaining is None or not self._checks_s:
            self.want()
            return
        left_s = self._remaining * statistics.median(self._checks_s) / self.lanes
        if left_s > self.cost_s:
            self.want()
        elif not self._said:
            self._said = True
            log.info(
                "The workers are ready, but the %d checks left would take about %.1f s here, less than handing "
                "them over costs: they run here",
                self._remaining,
                left_s,
            )
