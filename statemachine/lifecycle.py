"""The iteration lifecycle shared by every mode: generate -> check -> sort -> advance, until done.

One ``transitions.Machine`` owns the loop; a mode is a ``Strategy`` it calls. The machine is
queued, so each state's ``on_enter_*`` callback fires the next trigger without recursion.
A candidate whose key is already known (from a loaded replay, or checked earlier in this run)
takes the conditional ``generated -> advance`` transition: its recorded verdict is used, no check
runs and nothing is sorted. Triggers are declared on the model class with transitions' typed
``event`` placeholders (``model_override``), so mypy sees them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from transitions import Machine
from transitions.experimental.utils import event, with_model_definitions

if TYPE_CHECKING:
    from transitions.experimental.utils import TransitionConfigDictWithoutTrigger

from runner.artifacts import ArtifactSorter
from runner.checkers.base import Checker
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
    # a candidate whose verdict is known (loaded replay, or checked earlier) skips check and sort
    "generated": [
        {"source": "generate", "dest": "advance", "conditions": "verdict_known", "before": "reuse_verdict"},
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
    """Drives one strategy to its end.

    Args:
        strategy: the mode's strategy.
        checker: judges each candidate (may be None for modes that never check).
        sorter: sorts the check's artifacts into good/ and bad/.
        replay: records verdicts and supplies known ones.
        iter_artifact: where each candidate is written before its check.
        iter_info: path of the JSON file rewritten before each check, or None.
        progress: the terminal progress bar, or None.

    Attributes:
        history: every state entered, in order (starting with "ready").
        iteration: iterations so far (checked or reused).
        checks: checks actually run.
        passes: iterations whose verdict (checked or reused) was a pass.
        errors: iterations whose check could not judge the candidate (``Verdict.error``).
        failure_codes: the return codes of failing verdicts so far.
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

    def __init__(
        self,
        strategy: Strategy,
        checker: Optional[Checker],
        sorter: ArtifactSorter,
        replay: Replay,
        iter_artifact: Path,
        iter_info: Optional[Path] = None,
        progress: Optional[Progress] = None,
    ):
        self.strategy = strategy
        self.checker = checker
        self.sorter = sorter
        self.replay = replay
        self.iter_artifact = Path(iter_artifact)
        self.iter_info = Path(iter_info) if iter_info else None
        self.progress = progress
        self.history: List[str] = ["ready"]
        self.iteration = 0
        self.checks = 0
        self.reused_count = 0
        self.passes = 0
        self.errors = 0
        self.failure_codes: set = set()
        self.candidate: Optional[Candidate] = None
        self.verdict: Optional[Verdict] = None
        self._reused = False
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
            the ``failed`` state; the replay written so far stays on disk.
        """
        try:
            self.start()
        except BaseException:
            self.abort()
            raise
        return self.state

    def verdict_known(self) -> bool:
        """Condition: the replay already holds a verdict for the candidate."""
        assert self.candidate is not None
        return self.replay.lookup(self.candidate.key) is not None

    def reuse_verdict(self) -> None:
        """Before the ``generated -> advance`` transition: take the known verdict, run no check."""
        assert self.candidate is not None
        known = self.replay.lookup(self.candidate.key)
        assert known is not None
        log.info("Iteration %d: %s -> %s (reused, no check run)", self.iteration, self.candidate.label, _word(known))
        self.verdict = known
        self._reused = True
        self.reused_count += 1

    def on_enter_generate(self) -> None:
        """Ask the strategy for the next candidate; none left stops the run."""
        candidate = self.strategy.next_candidate()
        if candidate is None:
            self.exhausted()
            return
        self.iteration += 1
        self.candidate = candidate
        self._reused = False
        self.generated()

    def on_enter_check(self) -> None:
        """Write the artifact and run the checker."""
        assert self.candidate is not None
        # the path is passed even when the strategy writes nothing: the check may produce it
        artifact = self.iter_artifact
        self.iter_artifact.parent.mkdir(parents=True, exist_ok=True)
        if self.candidate.write is not None:
            self.candidate.write(self.iter_artifact)
        self._write_info(None)
        assert self.checker is not None, "a strategy that makes candidates needs a checker"
        self.checks += 1  # counted when started: a check that stops the run has run too
        self.verdict = self.checker.check(artifact, self.iteration, self.candidate)
        log.info(
            "Iteration %d: %s -> %s (%s)",
            self.iteration,
            self.candidate.label,
            _word(self.verdict),
            self.verdict.reason,
        )
        self.checked()

    def on_enter_sort(self) -> None:
        """Keep the intermediate if asked (before sorting may move it), then sort into good/ or bad/."""
        assert self.verdict is not None
        self.sorter.keep(self.iteration, self.iter_artifact, self.verdict)
        self.sorter.sort(self.iteration, self.verdict)
        self.sorted()

    def on_enter_advance(self) -> None:
        """Hand the verdict to the strategy, record it in the replay, update progress."""
        assert self.candidate is not None and self.verdict is not None
        self._count(self.verdict)
        self.strategy.take_verdict(self.candidate, self.verdict)
        self.replay.record(self.iteration, self.candidate, self.verdict, self._reused)
        self._write_info(self.verdict)
        if self.progress is not None:
            self.progress.update(self.iteration, _word(self.verdict), self.strategy.remaining(), self.checks)
        self.advanced()

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

    def _write_info(self, verdict: Optional[Verdict]) -> None:
        if self.iter_info is None or self.candidate is None:
            return
        info: Dict[str, Any] = {
            "iteration": self.iteration,
            "artifact": str(self.iter_artifact),
            "candidate": {"key": self.candidate.key, "label": self.candidate.label, **self.candidate.info},
            "state": self.strategy.state(),
        }
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
