"""``checker.on_error``: what a candidate the check could not judge counts as.

A backend that cannot run a candidate (compare) or a check function that raises (python) has not
judged it: ``stop`` ends the run with one line, ``fail`` or ``pass`` counts it so, marked ``error``
and counted apart in the summary, with one warning per run.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from runner.candidates import Verdict
from runner.config import plain
from runner.errors import CheckError, ConfigError

log = logging.getLogger(__name__)


class OnError:
    """One checker's ``on_error`` and whether it has warned yet.

    Args:
        value: "stop", "fail" or "pass" (the schema's enum member or its name).

    Raises:
        ConfigError: any other value.
    """

    def __init__(self, value: Any):
        self.value = str(plain(value))
        if self.value not in ("fail", "pass", "stop"):
            raise ConfigError(f"checker.on_error={self.value!r}; use fail, pass or stop")
        self._warned = False

    def verdict(
        self,
        iteration: int,
        problem: str,
        stop: str,
        reason: str,
        error: str,
        details: Optional[Dict[str, Any]] = None,
    ) -> Verdict:
        """The verdict of a candidate the check could not judge.

        Args:
            iteration: the 1-based iteration number (for the warning).
            problem: what happened, for the warning, e.g. "onnxruntime cannot run the candidate (...)".
            stop: the one-line error when ``on_error`` is "stop".
            reason, error, details: the verdict's (``error`` marks it as no real verdict).

        Raises:
            CheckError: with ``stop`` as its message, when ``on_error`` is "stop".
        """
        if self.value == "stop":
            raise CheckError(stop)
        if not self._warned:
            self._warned = True
            log.warning(
                "Iteration %d: %s; counted as %s (checker.on_error=%s), and apart as errors in the summary",
                iteration,
                problem,
                "a pass" if self.value == "pass" else "a failure",
                self.value,
            )
        return Verdict(self.value == "pass", reason=reason, details=dict(details or {}), error=error)

    def cannot_run(self, iteration: int, backend: str, e: Exception) -> Verdict:
        """The verdict of a candidate the backend ``backend`` cannot run (its error ``e``), as ``verdict`` says
        (compare's and validate's).

        Raises:
            CheckError: when ``on_error`` is "stop".
        """
        return self.verdict(
            iteration,
            f"{backend} cannot run the candidate ({e})",
            f"{backend} cannot run the candidate of iteration {iteration}: {e}; "
            "checker.on_error=fail counts such candidates as failures, on_error=pass as passes",
            f"{backend} failed: {e}",
            str(e),
            {"error": str(e)},
        )
