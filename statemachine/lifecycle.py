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

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set

from transitions import Machine
from transitions.experimental.utils import event, with_model_definitions

if TYPE_CHECKING:
    from transitions.experimental.utils import TransitionConfigDictWithoutTrigger

from runner import malloc
from runner.candidates import Candidate, Verdict
from runner.check_times import CheckTimes
from runner.checkers.base import Checker, Need
from runner.errors import ArtifactError
from runner.executors.base import Executor
from runner.executors.serial import SerialExecutor
from runner.files.artifacts import ArtifactSorter, remove_partial, worker_path
from runner.files.replay import Replay
from runner.terminal.progress import Progress
from runner.write_guard import check_write
from statemachine.iter_info import IterInfo
from statemachine.rounds import Pending, RoundChecks, build_ahead, word
from statemachine.same_bytes import SameBytes
from strategies.base import Strategy

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


class Lifecycle:
    """Drives one strategy to its end, a round of candidates at a time.

    Args:
        strategy: the mode's strategy.
        checker: judges each candidate (may be None for modes that never check).
        sorter: sorts the check's artifacts into good/ and bad/.
        replay: records verdicts and supplies known ones.
        iter_artifact: where each candidate is written before its check (with several workers, one
            path per worker: ``runner.files.artifacts.worker_path``).
        iter_info: path of the JSON file rewritten before each round and after each verdict, or None.
        progress: the terminal progress bar, or None.
        executor: runs the checks (default: serial, in this thread).

    Attributes:
        history: every state entered, in order (starting with "ready").
        iteration: the last iteration number given out (a cancelled check's number is not reused).
        taken: iterations whose verdict was taken (checked or reused).
        checks: checks started (a cancelled one included).
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
        check_times: Optional[CheckTimes] = None,
    ):
        self.strategy = strategy
        #: each check's seconds, for what chooses by a check's cost (``marker=auto``)
        self.check_times = check_times if check_times is not None else CheckTimes()
        self._round_started = time.monotonic()
        self.checker = checker
        self.sorter = sorter
        self.replay = replay
        self.iter_artifact = Path(iter_artifact)
        self.iter_info = IterInfo(Path(iter_info) if iter_info else None, self.iter_artifact)
        self.progress = progress
        self.executor = executor if executor is not None else SerialExecutor()
        self.history: List[str] = ["ready"]
        self.iteration = 0
        self.taken = 0
        self.checks = 0
        self.rounds = 0
        self.reused_count = 0
        #: the digests of the files checked this run, for copies of them (the written answer); not where the
        #: check may read the iteration's info (``artifacts.iter_info``), which tells a copy from its twin
        self.same_bytes = SameBytes(checker is not None and checker.verdict_by_bytes and not iter_info)
        self.check_s = 0.0  # seconds the checks run here took where they ran (reused verdicts cost none)
        self.reused_foreign = 0  # reused verdicts recorded with another identity (replay.force=true)
        self.crashed: Set[str] = set()  # candidates whose check crashed (the runner, or an isolated check's process)
        self.passes = 0
        self.errors = 0
        self.failure_codes: Set[Optional[int]] = set()
        self.round: List[Pending] = []
        self.verdict: Optional[Verdict] = None
        self._checks: Optional[RoundChecks] = None
        self._built_ahead: Set[str] = set()  # keys the last round's look-ahead built
        self.machine = LifecycleMachine(
            model=self,
            states=STATES,
            initial="ready",
            queued=True,
            auto_transitions=False,
            after_state_change="_record_state",
        )

    @property
    def crashes(self) -> int:
        """How many candidates crashed their check (each counted once, however often its verdict is reused)."""
        return len(self.crashed)

    @property
    def cancelled(self) -> int:
        """Checks cancelled because their round no longer needed them or the run stopped."""
        return self._checks.cancelled if self._checks is not None else 0

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
        finally:
            self.iter_info.clear()
        return self.state

    def round_known(self) -> bool:
        """Condition: the replay already holds a verdict for every candidate of the round."""
        return all(p.verdict is not None for p in self.round)

    def on_enter_generate(self) -> None:
        """Ask the strategy for the next round; none left stops the run. Known verdicts are reused."""
        malloc.trim()  # what the last round's candidates held goes back to the system
        self._round_started = time.monotonic()  # a candidate's whole cost, from here to its sorting
        candidates = self.strategy.next_round(self.executor.workers)
        if not candidates:
            self.exhausted()
            return
        self.round = []
        for candidate in candidates:
            self.iteration += 1
            pending = Pending(self.iteration, candidate)
            known = self.replay.lookup(candidate.key) if candidate.reuse else None
            twin = self.replay.lookup(candidate.twin) if candidate.twin else None
            if known is None and twin is not None and twin.crash:
                known = twin  # a copy of a candidate that crashed the runner: checking it would crash it again
                log.warning(
                    "Iteration %d: %s is the candidate that crashed the runner; not checked again",
                    self.iteration,
                    candidate.label,
                )
            if known is not None:
                self._reuse(pending, known, "reused, no check run")
            self.round.append(pending)
        self.generated()

    def on_enter_check(self) -> None:
        """Write the round's artifacts and check the candidates whose verdict is unknown, at once
        (``statemachine.rounds.RoundChecks``); on an error or Ctrl-C, keep the checks that ended."""
        assert self.checker is not None, "a strategy that makes candidates needs a checker"
        todo = [p for p in self.round if p.verdict is None]
        parallel = self.executor.workers > 1
        free = parallel or self.executor.threaded  # this thread is free while the checks run: it builds here, ahead
        if self._checks is None:
            self._checks = RoundChecks(self.executor, self.executor.share(self.checker), self.WAIT_S, self.check_times)
        try:
            ahead = sum(p.candidate.key in self._built_ahead for p in todo)
            if ahead:
                log.info("Round %d: %d of %d candidates were built ahead", self.rounds + 1, ahead, len(todo))
            # a round whose checks need nothing made (Need.nothing) has nothing worth building ahead either
            nothing_made = any(self._need(p.candidate) is Need.nothing for p in todo)
            for worker, pending in enumerate(todo):
                pending.slot = self.executor.slot(worker, pending.iteration)
                pending.artifact = worker_path(self.iter_artifact, worker, self.executor.workers)
                self._prepare(pending, free)
                if self.same_bytes.copy_of(pending.candidate, pending.artifact):  # statemachine.same_bytes
                    twin = self.replay.lookup(pending.candidate.twin or "")
                    if twin is not None:
                        self._reuse(pending, twin, "the same bytes as a file checked this run: reused, no check run")
            todo = [p for p in todo if p.verdict is None]
            self.iter_info.write(self.strategy.state(), self.round[-1] if not parallel else None, self.round)
            self.rounds += bool(todo)  # a round whose every verdict was known checks nothing
            self.checks += len(todo)  # counted when started: a check that stops the run has run too
            for pending in todo:  # a check that kills the runner stays pending: a resume counts it as a crash
                self.replay.begin(pending.iteration, pending.candidate)
            self.replay.flush()
            self._checks.run(
                todo,
                lambda: self.strategy.settled([p.verdict for p in self.round]),
                self._progress if parallel else None,
                self._lookahead() if free and self.executor.lookahead and not nothing_made else None,
            )
        except BaseException:
            self._salvage(todo)
            with contextlib.suppress(Exception):  # stopped cleanly: the checks that did not end crashed nothing
                self.replay.end([p.candidate.key for p in todo if p.verdict is None])
            raise
        self.checked()

    def _reuse(self, pending: Pending, known: Verdict, why: str) -> None:
        """``pending`` takes the verdict ``known`` without a check (logged with ``why``)."""
        log.info("Iteration %d: %s -> %s (%s)", pending.iteration, pending.candidate.label, word(known), why)
        pending.verdict, pending.reused = dataclasses.replace(known, reused=True), True
        self.reused_count += 1
        self.reused_foreign += pending.candidate.key in self.replay.foreign

    def _lookahead(self) -> Callable[[], bool]:
        """One piece of the strategy's ``lookahead`` per call (``statemachine.rounds.build_ahead``): False once
        none is left or there is no room for more; the keys built go into ``_built_ahead``."""
        self._built_ahead.clear()
        steps = build_ahead(
            lambda: self.strategy.lookahead(self.executor.workers), self.replay.lookup, self._built_ahead
        )
        return lambda: next(steps, False)

    def _prepare(self, pending: Pending, here: bool) -> None:
        """Write the candidate's artifact here (unless its check writes it, or needs no file: it runs
        nothing made or runs the in-memory model, ``Checker.needs``); where the checks run off this thread
        (``here``: several workers, or a threaded executor's one), build an in-process checker's model here too,
        where the strategy lives."""
        candidate = pending.candidate
        assert pending.artifact is not None
        pending.artifact.parent.mkdir(parents=True, exist_ok=True)
        need = self._need(candidate)
        if need is Need.nothing:
            return
        unread = not self.executor.elsewhere and not self.sorter.keep_intermediate
        if unread and need is Need.model:
            if here and candidate.payload is not None:
                candidate.payload()
            return
        if candidate.write is not None and not candidate.write_in_check:
            check_write(pending.artifact, f"iteration {pending.iteration}'s artifact")  # before: nothing removed
            try:
                candidate.write(pending.artifact)
            except OSError as e:  # a full disk mid-write: nothing partial stays behind
                remove_partial(pending.artifact)
                raise ArtifactError(
                    f"cannot write iteration {pending.iteration}'s artifact {pending.artifact} ({e.strerror}); free "
                    "some space or set artifacts.iter_artifact= elsewhere"
                ) from None
            except ArtifactError:
                remove_partial(pending.artifact)
                raise
            self.same_bytes.note(candidate, pending.artifact)
        if here and candidate.payload is not None and need is Need.model:
            candidate.payload()

    def _need(self, candidate: Candidate) -> Need:
        """What ``candidate``'s check needs made here (``Checker.needs``). A check that would need nothing
        needs its model (or file) where it runs in another process (``Candidate.portable``), and its file
        where every one is kept."""
        assert self.checker is not None
        need = self.checker.needs(candidate)
        if need is Need.nothing and (self.executor.elsewhere or self.sorter.keep_intermediate):
            return Need.model if candidate.payload is not None else Need.file
        return need

    def _salvage(self, todo: List[Pending]) -> None:
        """When the run stops mid-round: sort and record the checks that ended (a resumed run reuses them)."""
        for pending in todo:
            if pending.verdict is not None:
                try:
                    self._sort(pending)
                    self.replay.record(pending.iteration, pending.candidate, pending.verdict, False)
                except Exception as e:
                    log.warning("Iteration %d: could not keep its finished check (%s)", pending.iteration, e)

    def on_enter_sort(self) -> None:
        """Per checked candidate: keep the intermediate if asked (before sorting may move it), then
        sort into good/ or bad/. When sorting fails (a full disk), the round's verdicts are still
        recorded in the replay before the error stops the run, so a resume does not check them again."""
        try:
            for pending in self.round:
                if pending.verdict is not None and not pending.reused:
                    self._sort(pending)
        except BaseException:
            for pending in self.round:
                if pending.verdict is not None and not pending.reused:
                    with contextlib.suppress(Exception):  # the replay may not be writable either
                        self.replay.record(pending.iteration, pending.candidate, pending.verdict, False)
            raise
        checked = sum(p.verdict is not None and not p.reused for p in self.round)
        self.check_times.record_round(time.monotonic() - self._round_started, checked)
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
            self._count(pending.verdict, pending.candidate)
            if not pending.reused:
                self.check_s += pending.verdict.check_s or 0.0
            self.replay.record(pending.iteration, pending.candidate, pending.verdict, pending.reused)
        self.iter_info.clear()  # as Polygraphy: a check never reads another iteration's info
        self._progress(0)
        self.advanced()

    def _progress(self, in_flight: int) -> None:
        if self.progress is None:
            return
        last = self.verdict
        self.progress.update(
            self.taken,
            word(last) if last is not None else "-",
            self.strategy.remaining(),
            self.checks,
            rounds=self.rounds if self.executor.workers > 1 else None,
            in_flight=in_flight if self.executor.workers > 1 else None,
        )

    @property
    def same_failure(self) -> bool:
        """True when no verdict passed and every one failed with the same return code."""
        return self.passes == 0 and len(self.failure_codes) == 1

    def _count(self, verdict: Verdict, candidate: Candidate) -> None:
        if verdict.crash:
            self.crashed.add(candidate.twin or candidate.key)
        if verdict.error:
            self.errors += 1
        if verdict.passed:
            self.passes += 1
        else:
            self.failure_codes.add(verdict.returncode)
