"""The ``until`` option of repeat-style modes: stop at the first good, first bad, or after N runs."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from runner.candidates import Candidate, Verdict
from runner.errors import ConfigError
from strategies.base import RoundStrategy


@dataclass(frozen=True)
class Until:
    """A stop condition.

    Attributes:
        verdict: "good" or "bad" to stop at the first such verdict; None for a fixed count.
        count: the number of iterations to run when ``verdict`` is None.
    """

    verdict: Optional[str] = None
    count: Optional[int] = None

    def met(self, iterations: int, last_passed: bool) -> bool:
        """True when the run should stop after ``iterations`` runs, the last one with ``last_passed``."""
        if self.verdict == "good":
            return last_passed
        if self.verdict == "bad":
            return not last_passed
        assert self.count is not None
        return iterations >= self.count

    def remaining(self, iterations: int) -> Optional[int]:
        """Iterations left for a count; None (unknown) for good/bad."""
        return None if self.count is None else max(self.count - iterations, 0)

    @classmethod
    def parse(cls, value: object, mode: str) -> Until:
        """Parse ``until=good|bad|N``.

        Raises:
            ConfigError: when missing, not good/bad, or not a positive integer.
        """
        if value is None:
            raise ConfigError(
                f"mode={mode} needs a stop condition: until=bad, until=good or until=N (a positive number)"
            )
        text = str(value).strip().lower()
        if text in ("good", "bad"):
            return cls(verdict=text)
        try:
            count = int(text)
        except ValueError:
            raise ConfigError(
                f"until={value!r} is not good, bad or a number; use until=bad, until=good or until=N"
            ) from None
        if count <= 0:
            raise ConfigError(f"until={count} must be a positive number of iterations; use until=1 or more")
        return cls(count=count)


class RunCounter:
    """Counts good and bad runs until a stop condition is met (shared by repeat and build).

    Args:
        until: the stop condition.

    Attributes:
        runs, good, bad: counts so far. done: ``until`` was met.
    """

    def __init__(self, until: Until):
        self.until = until
        self.runs = 0
        self.good = 0
        self.bad = 0
        self.done = False

    def count(self, passed: bool) -> None:
        """Count one run's verdict and decide whether ``until`` is met."""
        self.runs += 1
        if passed:
            self.good += 1
        else:
            self.bad += 1
        self.done = self.until.met(self.runs, passed)

    def remaining(self) -> Optional[int]:
        """Runs left for ``until=N``; unknown (None) for good/bad."""
        return 0 if self.done else self.until.remaining(self.runs)

    def state(self) -> Dict[str, int]:
        """Counts so far."""
        return {"runs": self.runs, "good": self.good, "bad": self.bad}


class UntilStrategy(RoundStrategy):
    """Base of the repeat-style modes (repeat, build): one candidate per run, counted by a
    ``RunCounter`` until ``until`` is met; a subclass makes the candidates (``make``). With k workers
    a round holds k runs.

    Args:
        until: the stop condition.
    """

    def __init__(self, until: Until):
        self.counter = RunCounter(until)

    @abc.abstractmethod
    def make(self, n: int) -> Candidate:
        """The candidate of run number ``n`` (1-based)."""

    def next_round(self, k: int) -> List[Candidate]:
        """The next ``k`` runs at once (no more than ``until=N`` leaves), unless ``until`` was met."""
        if self.counter.done:
            return []
        left = self.counter.remaining()
        count = k if left is None else min(k, left)
        return [self.make(self.counter.runs + i) for i in range(1, count + 1)]

    def take_round(self, candidates: Sequence[Candidate], verdicts: Sequence[Optional[Verdict]]) -> None:
        """Count the round's verdicts in run order until ``until`` is met (a serial run stops there:
        the runs after it, checked or cancelled, are not counted)."""
        for verdict in verdicts:
            if verdict is None or self.counter.done:
                return
            self.counter.count(verdict.passed)

    def settled(self, verdicts: Sequence[Optional[Verdict]]) -> bool:
        """With ``until=good|bad``: the first such verdict, with every run before it known, ends the run."""
        wanted = self.counter.until.verdict
        if wanted is None:
            return False
        for verdict in verdicts:
            if verdict is None:
                return False
            if verdict.passed == (wanted == "good"):
                return True
        return False

    def remaining(self) -> Optional[int]:
        """Runs left for ``until=N``; unknown for good/bad."""
        return self.counter.remaining()

    def state(self) -> Dict[str, Any]:
        """Counts so far."""
        return dict(self.counter.state())

    def result(self) -> Dict[str, Any]:
        """Counts of good and bad runs, and whether ``until`` was met."""
        return {**self.counter.state(), "until_met": self.counter.done}
