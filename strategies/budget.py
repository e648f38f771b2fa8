"""A search's budget (``budget.checks=``, ``budget.seconds=``): where it stops short of its minimal answer.

A 1-minimal precision answer costs about one check per kept unit, and where most of a model must stay that is
hundreds of checks. With a budget, the search stops once this run has made ``checks`` checks or taken
``seconds`` (from the run's start; the ranking included), and its answer is the best one it has checked: the
smallest unit set whose verdict was the one the search looks for (precision: a passing candidate). That
answer is written and checked as written like any other; ``summary.json`` says ``minimal: false`` and why.
Verdicts replayed from ``replay.load=`` cost nothing, so a resume with a larger budget (or none) goes on to
the minimal answer without checking anything again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Optional

from runner.errors import ConfigError

Units = FrozenSet[int]

#: the pace at which ``Budget.over`` expects the answer's weights to be written, and read back by its check (bytes a
#: second): a cautious figure for a local disk, so that a 2.4 GB answer is given 12 s for each
WRITE_BYTES_PER_S = 200e6
#: seconds ``Budget.over`` keeps for what follows the answer's check: the summary, the replay, the process's end
FINISH_S = 1.0


@dataclass
class Budget:
    """What this run may spend, what it has spent, and the best answer so far.

    Attributes:
        checks: checks this run may make, or None.
        seconds: seconds from ``started``, or None.
        started: when the run started (``time.monotonic``).
        answer_bytes: the bytes of weights the answer is written with (its writing is kept room for).
        spent: checks made so far (not replayed).
        slowest: the seconds of the slowest check so far: a candidate checked as built (a gate), as the answer's
            own check is, costs more than the search's switched checks.
        best: the smallest unit set with the verdict the search looks for, checked so far.
        stopped: why the search stopped short ("" while it has not).
    """

    checks: Optional[int] = None
    seconds: Optional[float] = None
    started: float = field(default_factory=time.monotonic)
    answer_bytes: int = 0
    spent: int = 0
    slowest: float = 0.0
    best: Optional[Units] = None
    stopped: str = ""

    @classmethod
    def from_keys(cls, conf: Any, started: float, answer_bytes: int = 0) -> Optional[Budget]:
        """The budget of ``budget.*`` (``runner.config.BudgetConf``), or None when neither key is set;
        ``answer_bytes``: the model's weight bytes, which the answer is written with.

        Raises:
            ConfigError: a limit below 1 check or not above 0 seconds.
        """
        checks, seconds = conf.checks, conf.seconds
        if checks is None and seconds is None:
            return None
        if checks is not None and (not isinstance(checks, int) or checks < 1):
            raise ConfigError(f"budget.checks={checks}: give how many checks this run may make, 1 or more")
        if seconds is not None and not float(seconds) > 0:
            raise ConfigError(f"budget.seconds={seconds}: give how many seconds this run may take, above 0")
        return cls(checks, None if seconds is None else float(seconds), started, answer_bytes)

    def took(self, units: Optional[Units], hit: bool, reused: bool, seconds: Optional[float] = None) -> None:
        """Count one verdict: a check unless it was replayed (``seconds``: what it took where it ran); a hit of
        fewer units is the best so far."""
        if not reused:
            self.spent += 1
            self.slowest = max(self.slowest, seconds or 0.0)
        if hit and units is not None and (self.best is None or len(units) < len(self.best)):
            self.best = units

    def over(self) -> str:
        """Why the budget is spent ("" while it is not): the limit reached. ``seconds`` keeps room for the answer's
        own check and its writing: the search stops once the time left is under two checks at the pace so far (a
        round in flight), the slowest check so far (the answer is checked as built, as the gates were), the answer's
        weights written and read back at ``WRITE_BYTES_PER_S`` and ``FINISH_S``, so that the verified answer comes
        within the limit (a 2.4 GB decoder's answer took 10 s to write and 12 s to check from its file on an H200
        machine, where two checks at the run's pace were 5 s; the detector at 15 s ended at 15.8 s while its
        switched checks' pace alone was kept)."""
        if self.checks is not None and self.spent >= self.checks:
            return f"budget.checks={self.checks} reached"
        elapsed = time.monotonic() - self.started
        pace = elapsed / self.spent if self.spent else 0.0
        answer = 2 * self.answer_bytes / WRITE_BYTES_PER_S  # written, then read back by its check
        if self.seconds is not None and elapsed + 2 * pace + self.slowest + answer + FINISH_S >= self.seconds:
            return f"budget.seconds={self.seconds:g} reached ({elapsed:.0f} s, room kept for the answer's check)"
        return ""

    def allowance(self) -> Optional[float]:
        """Seconds work outside the search (a second ranking) may take: half of what is left of ``seconds``, never
        below 0; None without a time limit."""
        if self.seconds is None:
            return None
        return max(0.0, (self.seconds - (time.monotonic() - self.started)) / 2)

    def facts(self) -> Dict[str, Any]:
        """``summary.json``'s ``budget`` (limits, spent checks and seconds) and, when the search stopped short,
        ``minimal: false`` with ``minimal_why``."""
        found: Dict[str, Any] = {
            "budget": {
                "checks": self.checks,
                "seconds": self.seconds,
                "spent_checks": self.spent,
                "spent_seconds": round(time.monotonic() - self.started, 3),
            }
        }
        if self.stopped:
            found["minimal"] = False
            found["minimal_why"] = (
                f"{self.stopped}: the answer is the smallest passing set checked so far; resume with "
                "replay.load= and a larger budget (or none) for the minimal one"
            )
        return found
