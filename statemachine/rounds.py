"""The checks of one round on an executor: submit them, take each verdict as it ends, cancel the
ones a settled round no longer needs, and cancel every one when the run stops.

``statemachine.lifecycle`` owns the round (what to check, sorting, the replay); this module owns
the futures.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from runner.candidates import Candidate, Verdict
from runner.check_times import CheckTimes
from runner.errors import WorkerDiedError
from runner.executors.base import Executor, run_check, shipped
from runner.executors.slot import CheckCancelled, Slot

log = logging.getLogger("statemachine.lifecycle")  # the iteration lines stay in the lifecycle's log


@dataclass
class Pending:
    """One candidate of a round.

    Attributes:
        iteration: its 1-based iteration number.
        candidate: the candidate.
        verdict: its verdict once known (checked or reused); None while running, or when cancelled.
        reused: the verdict came from the replay.
        slot: where its check runs (None until submitted).
        artifact: its iteration artifact path (per worker slot).
        cancelled: its check was cancelled (no verdict).
        sorted: its artifacts were sorted.
        submitted: ``time.monotonic()`` when its check was handed to the executor.
    """

    iteration: int
    candidate: Candidate
    verdict: Optional[Verdict] = None
    reused: bool = False
    slot: Optional[Slot] = None
    artifact: Optional[Path] = None
    cancelled: bool = False
    sorted: bool = False
    submitted: float = 0.0


def word(verdict: Verdict) -> str:
    """ "pass" or "FAIL", for the log and the progress bar."""
    return "pass" if verdict.passed else "FAIL"


class RoundChecks:
    """Runs a round's checks on ``executor``.

    Args:
        executor: where the checks run.
        checker: what ``run_check`` receives as the checker (``executor.share`` of it).
        wait_s: seconds between looks at the running checks (also how soon Ctrl-C is seen).
        times: where each check's seconds are recorded (``runner.check_times``); None: a record of its own.

    Attributes:
        cancelled: checks cancelled so far, over every round (settled rounds and a stopped run).
    """

    #: seconds the checks of a round get to start before ``idle`` work competes with their set-up
    #: (an in-process check's Python code shares this process's GIL)
    START_S = 0.05
    #: the most of a round's time ``idle`` work may take: the rest is left to in-process checks
    #: (which need the GIL too) and to noticing checks that end (an idle step is not interrupted)
    IDLE_SHARE = 0.8

    def __init__(self, executor: Executor, checker: Any, wait_s: float, times: Optional[CheckTimes] = None):
        self.executor = executor
        self.times = times if times is not None else CheckTimes()
        self.checker = checker
        self.wait_s = wait_s
        self.cancelled = 0

    def run(
        self,
        todo: List[Pending],
        settled: Callable[[], bool],
        progress: Optional[Callable[[int], None]] = None,
        idle: Optional[Callable[[], bool]] = None,
    ) -> None:
        """Check every pending candidate (its slot and artifact set) and fill in its verdict; once
        ``settled()`` holds, cancel the checks still running.

        Args:
            todo: the candidates to check.
            settled: True when the verdicts so far decide the round.
            progress: called with the number of checks running whenever it changes.
            idle: called while checks run, between looks at them: does one short piece of work
                (build a candidate ahead) and returns True, or returns False when it has none left.

        Raises:
            Whatever a check raised, or KeyboardInterrupt, after cancelling every running check and
            waiting for it to end; the verdicts that came in are in ``todo``.
        """
        futures: Dict[Any, Pending] = {}
        try:
            for pending in todo:
                candidate = pending.candidate
                if self.executor.elsewhere:  # built here: a task elsewhere cannot call back into the strategy
                    candidate = shipped(candidate, f"executor={self.executor.name}")
                args = (self.checker, pending.artifact, pending.iteration, candidate, pending.slot)
                assert pending.slot is not None
                pending.submitted = time.monotonic()
                futures[self.executor.submit(run_check, *args, worker=pending.slot.worker)] = pending
                if progress is not None:
                    progress(len(futures))
            running = set(futures)
            work = _IdleWork(idle, self.IDLE_SHARE) if idle is not None else None
            timeout = self.START_S if work is not None else self.wait_s  # the checks set up first (GIL)
            while running:
                done, running = _first_ended(running, timeout)
                for future in done:
                    self._finished(futures[future], future)
                if running and settled():
                    self._cancel(running, futures, "its round no longer needs it")
                    return
                if progress is not None and done:
                    progress(len(running))
                timeout = work.step(self.wait_s, self.START_S) if work is not None else self.wait_s
        except BaseException:
            for future, pending in futures.items():  # the ones that ended beside the one that stopped the run
                if future.done() and pending.verdict is None and not pending.cancelled:
                    try:
                        pending.verdict = future.result()
                    except BaseException:
                        pending.cancelled = True
            self._cancel({f for f in futures if not f.done()}, futures, "the run stops")
            raise

    def _finished(self, pending: Pending, future: Any) -> None:
        """Take a finished check's verdict (or note it was cancelled); raise what the check raised."""
        try:
            pending.verdict = future.result()
        except CheckCancelled:
            pending.cancelled = True
            return
        except WorkerDiedError as e:
            raise WorkerDiedError(f"iteration {pending.iteration}: {e}") from None
        except BaseException as e:
            # a future dropped before it started: concurrent.futures' or asyncio's CancelledError,
            # distributed's FutureCancelledError
            if type(e).__name__.endswith("CancelledError"):
                pending.cancelled = True
                return
            raise
        verdict = pending.verdict
        # from handing the check over to its verdict here: beside check_s, what the executor costs
        verdict.verdict_s = round(time.monotonic() - pending.submitted, 4)
        self.times.record(verdict.check_s)
        log.info(
            "Iteration %d: %s -> %s (%s)", pending.iteration, pending.candidate.label, word(verdict), verdict.reason
        )
        log.debug(
            "Iteration %d: key %s, checked in %s s, verdict %s s after it was handed over",
            pending.iteration,
            pending.candidate.key,
            verdict.check_s,
            verdict.verdict_s,
        )

    def _cancel(self, running: Set[Any], futures: Dict[Any, Pending], why: str) -> None:
        """Cancel the running checks and wait until each has ended (a verdict that came first is
        kept), counting the ones cancelled; then clear their flags (a Dask scheduler forgets a
        cleared event)."""
        if not running:
            return
        log.info("Cancelling %d running check(s): %s", len(running), why)
        slots = [futures[f].slot for f in running]
        flags = [slot.cancel for slot in slots if slot is not None and slot.cancel is not None]
        for flag in flags:
            flag.set()
        for future in running:
            future.cancel()  # one not started never runs; one elsewhere is abandoned (``relay``)
        self._wait_cancelled(running, futures)
        for flag in flags:  # every check that had it has ended
            flag.clear()

    def _wait_cancelled(self, running: Set[Any], futures: Dict[Any, Pending]) -> None:
        while running:
            done, running = _first_ended(running, self.wait_s)
            for future in done:
                pending = futures[future]
                try:
                    self._finished(pending, future)
                except Exception as e:  # the run already stops or moves on; the check's error is only logged
                    log.warning("Iteration %d: its check ended with %s: %s", pending.iteration, type(e).__name__, e)
                    pending.cancelled = True
                if pending.verdict is None or pending.cancelled:
                    self.cancelled += 1


def _first_ended(futures: Set[Any], timeout_s: float) -> Tuple[Set[Any], Set[Any]]:
    """Wait up to ``timeout_s`` seconds for the first of ``futures`` to end: ``(done, not_done)``."""
    done, running = concurrent.futures.wait(futures, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)
    return set(done), set(running)


class _IdleWork:
    """Runs ``step`` (one short piece of work; False when none is left) between looks at the
    running checks, for at most ``share`` of the time since it was made."""

    def __init__(self, step: Callable[[], bool], share: float):
        self._step: Optional[Callable[[], bool]] = step
        self.share = share
        self.started = time.monotonic()
        self.spent_s = 0.0

    def step(self, wait_s: float, later_s: float) -> float:
        """One piece of work if the share allows; returns the seconds to wait for the checks before
        the next call: 0 after work, ``later_s`` while the share is used up, ``wait_s`` when done."""
        if self._step is None:
            return wait_s
        now = time.monotonic()
        if self.spent_s >= self.share * (now - self.started):
            return later_s
        more = self._step()
        self.spent_s += time.monotonic() - now
        if not more:
            self._step = None
            return wait_s
        return 0.0


def build_ahead(
    guesses: Callable[[], Iterable[Tuple[str, Callable[[], bool]]]], known: Callable[[str], Any], built: Set[str]
) -> Iterator[bool]:
    """Build a strategy's guesses (``guesses()`` gives the ``(key, build)`` of its ``lookahead``: a
    candidate the next round may hold, built while this round's checks run) one per ``next``, skipping
    keys ``known`` finds a verdict for and adding each key built to ``built``. Ends when none is left,
    one has no room (``build()`` is False), or one fails: a guess must never stop the run (its round,
    if it comes, says so). The guesses are asked for on the first ``next``, once the round's checks
    have started."""
    for key, build in guesses():
        if known(key) is not None:
            continue
        try:
            if not build():
                return  # no room for more
        except Exception as e:
            log.debug("Building a candidate ahead failed (%s: %s); no more this round", type(e).__name__, e)
            return
        built.add(key)
        yield True
