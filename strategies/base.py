"""The interface between the lifecycle (``statemachine/``) and a mode's strategy.

A strategy makes the next candidate, takes a verdict, says when it is done and estimates
what remains; the lifecycle owns the loop, the checks, sorting and the replay.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from runner.candidates import Candidate, Verdict


class Strategy(abc.ABC):
    """What a mode generates and how it advances. Subclasses live in ``strategies/<mode>.py``."""

    #: file suffix of the iteration artifact, e.g. ".onnx" or ".engine"
    artifact_suffix: str = ".onnx"

    #: True for searches whose answer means something only if some check passed: a run where no
    #: check passed ends with status "check never passed" instead of an answer
    needs_pass: bool = False

    #: for a search that relies on a monotone failure: True when its target is a passing candidate
    #: (precision), False when a failing one (reduce); the replay then watches verdicts that break it.
    #: None: no such search
    hit_on_pass: Optional[bool] = None

    def never_passed_hint(self) -> Optional[str]:
        """Why no check may have passed for a reason of the run's own making (finishing "no check passed
        in N iterations, and ..."), or None to blame the check (the default)."""
        return None

    @abc.abstractmethod
    def next_candidate(self) -> Optional[Candidate]:
        """Return the next candidate to check, or None when the search is over."""

    @abc.abstractmethod
    def take_verdict(self, candidate: Candidate, verdict: Verdict) -> None:
        """Record ``verdict`` for ``candidate`` (the one ``next_candidate`` returned last)."""

    def next_round(self, k: int) -> List[Candidate]:
        """Up to ``k`` candidates that may be checked at once (one round for ``k`` workers), in the
        order a serial run would take their verdicts; empty when the run is over. Default: the one
        ``next_candidate``."""
        candidate = self.next_candidate()
        return [] if candidate is None else [candidate]

    def take_round(self, candidates: Sequence[Candidate], verdicts: Sequence[Optional[Verdict]]) -> None:
        """Record the verdicts of the round ``next_round`` returned last, in its order; None for a
        check cancelled once the round was ``settled``. Default: ``take_verdict`` for each, up to the
        first None."""
        for candidate, verdict in zip(candidates, verdicts):
            if verdict is None:
                return
            self.take_verdict(candidate, verdict)

    def settled(self, verdicts: Sequence[Optional[Verdict]]) -> bool:
        """True when the round's verdicts known so far (None: still running) decide what
        ``take_round`` does, so the checks still running may be cancelled. Default False."""
        return False

    def lookahead(self, k: int) -> List[Tuple[str, Callable[[], bool]]]:
        """Work that may save time in the next round, done while this round's checks run: ``(key,
        build)`` for candidates a round of ``k`` after the round ``next_round`` returned last may
        hold, most useful first; ``build()`` prepares that candidate (e.g. builds its model) so
        that the next ``next_round`` makes and writes it quickly, and returns False when it has no
        room for more. A guess: building what is never checked costs only time and memory. The
        lifecycle skips keys whose verdict it knows. Default: nothing."""
        return []

    def artifacts(self) -> List[Path]:
        """Files the strategy writes each iteration that are sorted like ``artifacts.paths`` (default none)."""
        return []

    def remaining(self) -> Optional[int]:
        """Estimated number of iterations left, or None when unknown."""
        return None

    def state(self) -> Dict[str, Any]:
        """The mode's state, JSON-able, written to ``artifacts.iter_info`` each iteration."""
        return {}

    def result(self) -> Dict[str, Any]:
        """The mode's result for ``summary.json``; called once, after the loop ends normally."""
        return {}

    def finish(self) -> None:
        """Write the mode's outputs (e.g. the reduced model); called after the loop ends normally."""


class RoundStrategy(Strategy):
    """A strategy written in rounds (``next_round``, ``take_round``); a single candidate is a round of one."""

    @abc.abstractmethod
    def next_round(self, k: int) -> List[Candidate]:
        """Up to ``k`` candidates that may be checked at once; see ``Strategy.next_round``."""

    def next_candidate(self) -> Optional[Candidate]:
        """The next candidate: a round of one."""
        round_ = self.next_round(1)
        return round_[0] if round_ else None

    def take_verdict(self, candidate: Candidate, verdict: Verdict) -> None:
        """The verdict of the candidate ``next_candidate`` returned last: a round of one."""
        self.take_round([candidate], [verdict])


class Report(abc.ABC):
    """A mode that checks no candidate (layerwise, diff_tactics): the run builds no lifecycle and no
    checker of its own (a report that compares is given the compare checker to read its settings),
    calls ``finish`` once and puts ``result`` in ``summary.json``. Subclasses live in ``strategies/<mode>.py``."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Compute the report and write its files.

        Raises:
            RunnerError: the report cannot be made (a bad model, inputs or options).
        """

    @abc.abstractmethod
    def result(self) -> Dict[str, Any]:
        """The report's fields for ``summary.json``; called once, after ``finish``."""
