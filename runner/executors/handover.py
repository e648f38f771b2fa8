"""When ``executor=processes`` starts its worker processes, and when it hands its checks to them.

Workers cost the runner twice. Starting them (spawning, importing Dask and ONNX Runtime in each)
takes about 4 to 9 s on an H100 machine and slows the runner's own work meanwhile: a cheap
precision run of the detector (checks of 0.3 s) took 0.90 to 1.16x serial with workers started
at once and every check kept in the runner, and 0.86 to 0.99x with workers never started
(benchmarks/README.md, "GPU checks"). Started seconds later, they win less on dear checks (0.68 to 0.92x where
started with the run they took 0.69 to 0.72x): ``start="now"`` is for runs known to be dear.
Handing over once they are ready costs about a second of the runner's interpreter (importing
Dask, connecting, sending the checker and a warm-up check to each worker) and each worker a first
check of the model: a run handed over with about 2 s of checks left took 9.4 s where the two that
kept their checks took 6.8 and 6.9 s.

``HandOver`` makes both decisions from the work the runner has measured (its checks, and the jobs
of ``Executor.spread``: precision's ranking) and the work left (the strategy's estimate of its
checks, the jobs not yet ended), run ``lanes`` at a time here at the median pace so far:

- start (``launch``): with ``start="auto"``, once the work left would take longer here than the
  workers' start-up and the hand-over together (``start_s + cost_s``), or at once when the
  strategy cannot estimate its checks; ``start="now"`` starts them with the run. The first
  ``lanes`` jobs or checks here also pay for the backend's own start (a CUDA context, cuDNN's
  handles): on them alone the work left must take twice as long;
- connect (``wanted``): once they are ready, when the checks left would take longer here than
  ``cost_s``; at once when the estimate is unknown, when nothing was checked here yet, or when
  other work asks for them (``Executor.spread``'s jobs, a check that must run on a worker).
"""

from __future__ import annotations

import logging
import statistics
import threading
from typing import List, Optional

from runner.errors import ConfigError

log = logging.getLogger(__name__)

#: the values of ``executor.start``
STARTS = ("auto", "now")


class HandOver:
    """The decisions to start the workers and to connect to them once ready.

    Args:
        lanes: checks (or jobs) at once here: the executor's slots.
        cost_s: seconds the hand-over is taken to cost (see the module docstring).
        start: ``"auto"``: start the workers once the work left is long enough to pay for them;
            ``"now"``: at once.
        start_s: seconds the workers are taken to need to start (measured: 4 to 7 s on an H100).

    Attributes:
        launch: set once the workers should start.
        wanted: set once the ready workers should be used; the executor connects after it.

    Raises:
        ConfigError: ``start`` is neither ``"auto"`` nor ``"now"``.
    """

    def __init__(self, lanes: int, cost_s: float = 3.0, start: str = "auto", start_s: float = 5.0):
        if start not in STARTS:
            raise ConfigError(
                f"executor.start={start!r} is not one of {', '.join(STARTS)}: auto starts the worker processes once "
                "the work left pays for them, now with the run"
            )
        self.lanes, self.cost_s, self.start_s = max(1, lanes), cost_s, start_s
        self.launch = threading.Event()
        self.wanted = threading.Event()
        self._checks_s: List[float] = []  # the checks run here so far, seconds each
        self._jobs_s: List[float] = []  # the spread jobs run here so far, seconds each
        self._jobs_left = 0  # spread jobs not yet ended (the latest count)
        self._remaining: Optional[int] = None  # the strategy's latest estimate of the checks left (None: unknown)
        self._expected = False  # the strategy gave an estimate (before its first round, no checks are counted)
        self._ready = False
        self._said = False
        self._lock = threading.Lock()
        if start == "now":
            self.launch.set()

    def checked_here(self, seconds: float) -> None:
        """Note a check that ran here and took ``seconds``."""
        self._checks_s.append(seconds)
        self._consider_start()

    def job_here(self, seconds: float, left: Optional[int]) -> None:
        """Note a job of ``Executor.spread`` that ran here and took ``seconds``, with ``left`` jobs
        not yet ended (None: unknown, taken as none)."""
        self._jobs_s.append(seconds)
        self._jobs_left = left or 0
        self._consider_start()

    def jobs_ended(self) -> None:
        """The jobs of a ``spread`` have all ended."""
        self._jobs_left = 0

    def want(self) -> None:
        """Start the workers if they have not started, and use them once ready."""
        self.launch.set()
        self.wanted.set()

    def ready(self) -> None:
        """The workers are ready: decide with the latest estimate (``expect``); with no check
        ended here yet (none started, or they ran the whole start-up long), hand over."""
        self._ready = True
        self._decide()

    def expect(self, remaining: Optional[int], ready: bool) -> None:
        """Take the strategy's estimate of the checks still to come (None: unknown) before a round;
        ``ready``: the workers could be connected now. The hand-over waits for the workers: until
        they are ready the estimate is only kept (early in a search many checks are left, and
        few may be by the time the workers are up)."""
        self._remaining, self._expected = remaining, True
        self._ready = self._ready or ready
        if self._ready:
            self._decide()
        self._consider_start()

    def left_s(self, checks: Optional[int]) -> Optional[float]:
        """Seconds the work left would take here: ``checks`` checks and the spread jobs not yet
        ended, ``lanes`` at a time at the median pace of each kind so far. Until a check has ended
        here, a check is taken to cost what the dearest job did: precision's ranking runs most
        nodes alone in small models (on an H100, 0.1 to 1.3 s each with cuDNN's exhaustive search,
        where a check took 2.5 s) and the whole model once (5 s). None before anything was
        measured here."""
        if not self._checks_s and not self._jobs_s:
            return None
        check_s = statistics.median(self._checks_s) if self._checks_s else max(self._jobs_s)
        job_s = statistics.median(self._jobs_s) if self._jobs_s else 0.0
        return ((checks or 0) * check_s + self._jobs_left * job_s) / self.lanes

    def _consider_start(self) -> None:
        """Set ``launch`` when the strategy cannot estimate its checks, or once the work left would
        take longer here than the workers' start-up and the hand-over."""
        with self._lock:  # checks and jobs end in several threads: one decision, one line
            if not self.launch.is_set():
                self._start_if_paid()

    def _start_if_paid(self) -> None:
        """``_consider_start``'s decision, under its lock."""
        unknown = self._expected and self._remaining is None
        left_s = self.left_s(self._remaining)
        first_wave = len(self._checks_s) + len(self._jobs_s) <= self.lanes  # they paid for the backend's start
        paid_s = (self.start_s + self.cost_s) * (2 if first_wave else 1)
        log.debug(
            "Work left here: %s checks, %d jobs, about %s s (the workers start over %.0f s); latest jobs %s s, "
            "checks %s s",
            self._remaining,
            self._jobs_left,
            "?" if left_s is None else f"{left_s:.1f}",
            paid_s,
            [round(s, 2) for s in self._jobs_s[-4:]],
            [round(s, 2) for s in self._checks_s[-4:]],
        )
        if unknown or (left_s is not None and left_s > paid_s):
            why = (
                "The strategy cannot estimate its checks left"
                if unknown
                else f"The work left would take about {left_s:.0f} s here, more than the workers' start-up"
            )
            log.info("%s: they start", why)
            self.launch.set()

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
