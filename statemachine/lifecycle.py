"""The iteration lifecycle shared by every mode: generate -> check -> sort -> advance, until done.

One ``transitions.Machine`` owns the loop; a mode is a ``Strategy`` it calls. Each pass is a
*round*: the strategy proposes up to ``executor.workers`` candidates (``next_round``), the executor
checks the ones whose verdict is unknown at once, their artifacts are sorted, and the strategy takes
the round's verdicts in its order (``take_round``). With the serial executor a round is one
candidate, checked in this thread. The machine is queued, so each state's ``on_enter_*`` callback
fires the next trigger without recursion. A round whose every key is already known (from a loaded
replay, or checked earlier in this run) takes the conditional ``generated -> advance`` transition:
no check runs and nothing is sorted. Once the strategy says a round is ``settled``, the checks
still running are cancelled; on Ctrl-C or an error every running check is cancelled and waited
for, and the finished ones are sorted and recorded in the replay before the run stops. Triggers are
declared on the model class with transitions' typed ``event`` placeholders (``model_override``), so
mypy sees them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from transitions import Machine
from transitions.experimental.utils import event, with_model_definitions

if TYPE_CHECKING:
    from transitions.experimental.utils import TransitionConfigDictWithoutTrigger

from runner.artifacts import ArtifactSorter, worker_path
from runner.checkers.base import Checker
from runner.executors.base import Executor, run_check
from runner.executors.serial import SerialExecutor
from runner.executors.slot import CheckCancelled, Slot
from runner.jsonio import write_json_atomic
from runner.progress import Progress
from runner.replay import Replay
from strategies.base import Candidate, Strategy, Verdict

log = logging.getLogger(__name__)
logging.getLogger("transitions").setLevel(logging.ERROR)  # it warns of every helper model_override skips

STATES = ["ready", "generate", "check", "sort", "advance", "stopped", "failed"]

#: trigger -> its transitions, tried in order (the first whose conditions hold is taken)
TRANSITIONS: Dict[str, List[TransitionConfigDictWithoutTrigger]] = {
    "start": [{"source": "ready", "dest": "generate"}],
    # a round whose verdicts are all known (loaded replay, or checked earlier) skips check and sort
    "generated": [
        {"source": "generate", "dest": "advance", "conditions": "round_known"},
        {"source": "generate", "dest": "check"},
    ],
    "exhausted": [{"source": "generate", "dest": "stopped"}],
    "checked": [{"source": "check", "dest": "sort"}],
    "sorted": [{"source": "sort", "dest": "advance"}],
    "advanced": [{"source": "advance", "dest": "generate"}],
    "abort": [{"source": "*", "dest": "failed"}],
}


@with_model_definitions
class LifecycleMachine(Machine):
    """A ``transitions`` machine that adds the transitions a model class declares with ``event``."""


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
    """

    iteration: int
    candidate: Candidate
    verdict: Optional[Verdict] = None
    reused: bool = False
    slot: Optional[Slot] = None
    artifact: Optional[Path] = None
    cancelled: bool = False
    sorted: bool = False


class Lifecycle:
    """Drives one strategy to its end, a round of candidates at a time.

    Args:
        strategy: the mode's strategy.
        checker: judges each candidate (may be None for modes that never check).
        sorter: sorts the check's artifacts into good/ and bad/.
        replay: records verdicts and supplies known ones.
        iter_artifact: where each candidate is written before its check (with several workers, one
            path per worker: ``runner.artifacts.worker_path``).
        iter_info: path of the JSON file rewritten before each round and after each verdict, or None.
        progress: the terminal progress bar, or None.
        executor: runs the checks (default: serial, in this thread).

    Attributes:
        history: every state entered, in order (starting with "ready").
        iteration: the last iteration number given out (a cancelled check's number is not reused).
        taken: iterations whose verdict was taken (checked or reused).
        checks: checks started (a cancelled one included).
        cancelled: checks cancelled because their round no longer needed them.
        rounds: rounds that ran at least one check (with one worker, the checks).
        passes: iterations whose verdict (checked or reused) was a pass.
        errors: iterations whose check could not judge the candidate (``Verdict.error``).
        failure_codes: the return codes of failing verdicts so far.
        verdict: the last verdict taken.
    """

    state: str = "ready"
    # triggers, typed for mypy; the machine binds them from TRANSITIONS
    start = event(*TRANSITIONS["start"])
    generated = event(*TRANSITIONS["generated"])
    exhausted = event(*TRANSITIONS["exhausted"])
    checked = event(*TRANSITIONS["checked"])
    sorted = event(*TRANSITIONS["sorted"])
    advanced = event(*TRANSITIONS["advanced"])
    abort = event(*TRANSITIONS["abort"])

    #: seconds between looks at the running checks (also how soon Ctrl-C is seen while waiting)
    WAIT_S = 0.5

    def __init__(
        self,
        strategy: Strategy,
        checker: Optional[Checker],
        sorter: ArtifactSorter,
        replay: Replay,
        iter_artifact: Path,
        iter_info: Optional[Path] = None,
        progress: Optional[Progress] = None,
        executor: Optional[Executor] = None,
    ):
        self.strategy = strategy
        self.checker = checker
        self.sorter = sorter
        self.replay = replay
        self.iter_artifact = Path(iter_artifact)
        self.iter_info = Path(iter_info) if iter_info else None
        self.progress = progress
        self.executor = executor if executor is not None else SerialExecutor()
        self.history: List[str] = ["ready"]
        self.iteration = 0
        self.taken = 0
        self.checks = 0
        self.cancelled = 0
        self.rounds = 0
        self.reused_count = 0
        self.passes = 0
        self.errors = 0
        self.failure_codes: set = set()
        self.round: List[Pending] = []
        self.verdict: Optional[Verdict] = None
        self._checker_handle: Any = None
        self.machine = LifecycleMachine(
            model=self,
            states=STATES,
            initial="ready",
            queued=True,
            auto_transitions=False,
            after_state_change="_record_state",
        )

    def _record_state(self) -> None:
        self.history.append(self.state)

    def run(self) -> str:
        """Run until the strategy is done.

        Returns:
            The final state, "stopped".

        Raises:
            Whatever a callback raised (a RunnerError, KeyboardInterrupt, ...), after entering
            the ``failed`` state; the replay written so far stays on disk, with every check that
            finished.
        """
        try:
            self.start()
        except BaseException:
            self.abort()
            raise
        return self.state

    def round_known(self) -> bool:
        """Condition: the replay already holds a verdict for every candidate of the round."""
        return all(p.verdict is not None for p in self.round)

    def on_enter_generate(self) -> None:
        """Ask the strategy for the next round; none left stops the run. Known verdicts are reused."""
        candidates = self.strategy.next_round(self.executor.workers)
        if not candidates:
            self.exhausted()
            return
        self.round = []
        for candidate in candidates:
            self.iteration += 1
            pending = Pending(self.iteration, candidate)
            known = self.replay.lookup(candidate.key)
            if known is not None:
                log.info("Iteration %d: %s -> %s (reused, no check run)", self.iteration, candidate.label, _word(known))
                pending.verdict, pending.reused = known, True
                self.reused_count += 1
            self.round.append(pending)
        self.generated()

    def on_enter_check(self) -> None:
        """Write the round's artifacts and check the candidates whose verdict is unknown, at once;
        cancel the checks still running once the strategy says the round is settled."""
        assert self.checker is not None, "a strategy that makes candidates needs a checker"
        todo = [p for p in self.round if p.verdict is None]
        parallel = self.executor.workers > 1
        if self._checker_handle is None:
            self._checker_handle = self.executor.share(self.checker)
        futures: Dict[Any, Pending] = {}
        try:
            for worker, pending in enumerate(todo):
                pending.slot = self.executor.slot(worker, pending.iteration)
                pending.artifact = worker_path(self.iter_artifact, worker, self.executor.workers)
                self._prepare(pending, parallel)
            self._write_info(self.round[-1] if not parallel else None, None)
            self.rounds += 1
            for pending in todo:
                self.checks += 1  # counted when started: a check that stops the run has run too
                shipped = self.executor.ship(pending.candidate)
                args = (self._checker_handle, pending.artifact, pending.iteration, shipped, pending.slot)
                future = self.executor.submit(run_check, *args)
                futures[future] = pending
                if parallel:
                    self._progress(len(futures))
            running = set(futures)
            while running:
                done, running = self.executor.wait(running, self.WAIT_S)
                for future in done:
                    self._finished(futures[future], future)
                if running and self.strategy.settled([p.verdict for p in self.round]):
                    self._cancel(running, futures, "its round no longer needs it")
                    running = set()
                if parallel and done:
                    self._progress(len(running))
        except BaseException:
            self._cancel({f for f in futures if not f.done()}, futures, "the run stops")
            self._salvage(futures)
            raise
        self.checked()

    def _prepare(self, pending: Pending, parallel: bool) -> None:
        """Write the candidate's artifact here (unless its check writes it); with several workers,
        build an in-process checker's model here too, where the strategy lives."""
        candidate = pending.candidate
        assert pending.artifact is not None
        pending.artifact.parent.mkdir(parents=True, exist_ok=True)
        if candidate.write is not None and not candidate.write_in_check:
            candidate.write(pending.artifact)
        if parallel and candidate.payload is not None and self.checker is not None and self.checker.uses_payload:
            candidate.payload()

    def _finished(self, pending: Pending, future: Any) -> None:
        """Take a finished check's verdict (or note it was cancelled); raise what the check raised."""
        try:
            pending.verdict = future.result()
        except CheckCancelled:
            pending.cancelled = True
            return
        except BaseException as e:
            # a future dropped before it started: concurrent.futures' or asyncio's CancelledError,
            # distributed's FutureCancelledError
            if type(e).__name__.endswith("CancelledError"):
                pending.cancelled = True
                return
            raise
        verdict = pending.verdict
        log.info(
            "Iteration %d: %s -> %s (%s)", pending.iteration, pending.candidate.label, _word(verdict), verdict.reason
        )

    def _cancel(self, running: set, futures: Dict[Any, Pending], why: str) -> None:
        """Cancel the running checks and wait until each has ended (its verdict, if it came first, is kept)."""
        if not running:
            return
        log.info("Cancelling %d running check(s): %s", len(running), why)
        for future in running:
            slot = futures[future].slot
            if slot is not None and slot.cancel is not None:
                slot.cancel.set()
            self.executor.cancel(future)
        while running:
            done, running = self.executor.wait(running, self.WAIT_S)
            for future in done:
                pending = futures[future]
                try:
                    self._finished(pending, future)
                except Exception as e:  # the run already stops or moves on; the check's error is only logged
                    log.warning("Iteration %d: its check ended with %s: %s", pending.iteration, type(e).__name__, e)
                    pending.cancelled = True
                if pending.verdict is None or pending.cancelled:
                    self.cancelled += 1

    def _salvage(self, futures: Dict[Any, Pending]) -> None:
        """When the run stops mid-round: sort and record the checks that finished (a resumed run reuses them)."""
        for future, pending in futures.items():
            if pending.verdict is None and not pending.cancelled and future.done():
                try:  # a check that ended beside the one that stopped the run, not yet taken
                    pending.verdict = future.result()
                except BaseException:
                    continue
            if pending.verdict is not None and not pending.reused:
                try:
                    self._sort(pending)
                    self.replay.record(pending.iteration, pending.candidate, pending.verdict, False)
                except Exception as e:
                    log.warning("Iteration %d: could not keep its finished check (%s)", pending.iteration, e)

    def on_enter_sort(self) -> None:
        """Per checked candidate: keep the intermediate if asked (before sorting may move it), then
        sort into good/ or bad/."""
        for pending in self.round:
            if pending.verdict is not None and not pending.reused:
                self._sort(pending)
        self.sorted()

    def _sort(self, pending: Pending) -> None:
        if pending.sorted:
            return
        assert pending.verdict is not None
        pending.sorted = True
        self.sorter.keep(pending.iteration, pending.artifact, pending.verdict)
        self.sorter.sort(pending.iteration, pending.verdict, pending.slot.worker if pending.slot else 0)

    def on_enter_advance(self) -> None:
        """Hand the round's verdicts to the strategy, record them in the replay, update progress."""
        verdicts = [p.verdict for p in self.round]
        self.strategy.take_round([p.candidate for p in self.round], verdicts)
        for pending in self.round:
            if pending.verdict is None:
                continue
            self.taken += 1
            self.verdict = pending.verdict
            self._count(pending.verdict)
            self.replay.record(pending.iteration, pending.candidate, pending.verdict, pending.reused)
            self._write_info(pending, pending.verdict)
        self._progress(0)
        self.advanced()

    def _progress(self, in_flight: int) -> None:
        if self.progress is None:
            return
        last = self.verdict
        self.progress.update(
            self.taken,
            _word(last) if last is not None else "-",
            self.strategy.remaining(),
            self.checks,
            rounds=self.rounds if self.executor.workers > 1 else None,
            in_flight=in_flight if self.executor.workers > 1 else None,
        )

    @property
    def same_failure(self) -> bool:
        """True when no verdict passed and every one failed with the same return code."""
        return self.passes == 0 and len(self.failure_codes) == 1

    def _count(self, verdict: Verdict) -> None:
        if verdict.error:
            self.errors += 1
        if verdict.passed:
            self.passes += 1
        else:
            self.failure_codes.add(verdict.returncode)

    def _write_info(self, pending: Optional[Pending], verdict: Optional[Verdict]) -> None:
        """Rewrite ``iter_info``: one iteration (before its check, or with its verdict), or, before a
        round of several checks, the round (``in_flight``)."""
        if self.iter_info is None:
            return
        info: Dict[str, Any] = {"state": self.strategy.state()}
        if pending is not None:
            candidate = pending.candidate
            info.update(
                iteration=pending.iteration,
                artifact=str(pending.artifact or self.iter_artifact),
                candidate={"key": candidate.key, "label": candidate.label, **candidate.info},
            )
        else:
            info["in_flight"] = [
                {"iteration": p.iteration, "artifact": str(p.artifact), "label": p.candidate.label}
                for p in self.round
                if p.verdict is None
            ]
        if verdict is not None:
            info["verdict"] = {
                "passed": verdict.passed,
                "returncode": verdict.returncode,
                "reason": verdict.reason,
                "details": verdict.details,
            }
        write_json_atomic(self.iter_info, info)


def _word(verdict: Verdict) -> str:
    return "pass" if verdict.passed else "FAIL"
