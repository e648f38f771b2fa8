"""The python checker: call a user's function in-process, no subprocess per iteration."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Sequence

from hydra.utils import get_method

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker
from runner.errors import CheckStartError
from runner.executors.slot import Slot

log = logging.getLogger(__name__)


class PythonChecker(Checker):
    """Calls ``target(artifact_path: str, *args) -> bool``; True means the iteration passed.

    An exception raised by the function counts as a failure of the candidate (as a crashing
    check command does) and its message becomes the verdict's reason.

    Args:
        target: dotted path of the function, e.g. ``mypkg.checks.no_nan``.
        args: extra string arguments passed after the path (``checker.args=[a,b]``), so one
            function serves several checks.

    Raises:
        CheckStartError: when ``target`` cannot be imported or is not callable.
    """

    def __init__(self, target: str, args: Sequence[str] = ()):
        try:
            self.fn = get_method(target)
        except Exception as e:  # hydra wraps import errors in ImportError/ValueError
            raise CheckStartError(
                f"checker.target={target!r} cannot be imported ({e}); give a module.function on PYTHONPATH"
            ) from None
        self.target = target
        self.args = [str(a) for a in args]

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Call the function once with the artifact's path as a string."""
        try:
            ok = self.fn(str(artifact) if artifact is not None else None, *self.args)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            log.info("%s raised %s: %s", self.target, type(e).__name__, e)
            return Verdict(False, reason=f"{type(e).__name__}: {e}")
        return Verdict(bool(ok), reason=f"{self.target} returned {ok!r}")
