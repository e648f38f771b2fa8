"""The ``until`` option of repeat-style modes: stop at the first good, first bad, or after N runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from runner.errors import ConfigError


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
    def parse(cls, value: object, mode: str) -> "Until":
        """Parse ``until=good|bad|N``.

        Raises:
            ConfigError: when missing, not good/bad, or not a positive integer.
        """
        if value is None:
            raise ConfigError(f"mode={mode} needs a stop condition: until=bad, until=good or until=N (a positive number)")
        text = str(value).strip().lower()
        if text in ("good", "bad"):
            return cls(verdict=text)
        try:
            count = int(text)
        except ValueError:
            raise ConfigError(f"until={value!r} is not good, bad or a number; use until=bad, until=good or until=N") from None
        if count <= 0:
            raise ConfigError(f"until={count} must be a positive number of iterations; use until=1 or more")
        return cls(count=count)
