"""The python checker: call a user's function in-process, no subprocess per iteration."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from runner.callables import TARGET, lookup
from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker, conf_of
from runner.checkers.on_error import OnError
from runner.config import PythonCheckerConf
from runner.errors import CheckStartError, first_line
from runner.executors.slot import Slot
from runner.targets import locate

log = logging.getLogger(__name__)

#: targets that name a callable registered by the API (``runner.callables``; the second, older configs')
REGISTERED = (TARGET, "runner.api.call_registered")


class PythonChecker(Checker):
    """Calls ``target(artifact_path: str, *args) -> bool``; True means the iteration passed.

    A function that raises or calls ``sys.exit`` has not judged the candidate: that is an error of
    the check, never a verdict (a check that raised on candidates missing one node once made such
    a node look needed). ``on_error`` says what happens: ``stop`` (the default) ends the run with a
    one-line error naming the exception; ``fail``/``pass`` count the candidate so, apart from real
    verdicts (``errors`` in ``summary.json``).

    Args:
        conf: the checker's schema, ``runner.config.PythonCheckerConf`` (``PythonChecker.of(target, *args)``
            fills it), whose keys mean:

    Keys:
        target: dotted path of the function, e.g. ``mypkg.checks.no_nan``.
        args: extra string arguments passed after the path (``checker.args=[a,b]``), so one
            function serves several checks.
        on_error: "stop", "fail" or "pass".

    Raises:
        CheckStartError: when ``target`` cannot be imported or is not callable.
        ConfigError: an unknown ``on_error``.
    """

    fix_hint = "check that checker.target returns False for the model as given"
    verdict_by_bytes = True

    schema = PythonCheckerConf

    def __init__(self, conf: PythonCheckerConf):
        target, on_error = conf.target, conf.on_error
        self.target = target
        self.args = [str(a) for a in conf.args]
        self.fn: Callable[..., Any]
        if target in REGISTERED and self.args:  # an API callable: the function itself, so it can go to a child
            try:
                self.fn, self.target, self.args = lookup(self.args[0]), self.args[0], self.args[1:]
            except KeyError as e:
                raise CheckStartError(first_line(e)) from None
        else:
            self.fn = locate(target, "checker.target", CheckStartError)
            if not callable(self.fn):
                raise CheckStartError(f"checker.target={target} is a {type(self.fn).__name__}; name a function")
        self.on_error = OnError(on_error)

    @classmethod
    def of(cls, target: str, *args: str, **keys: Any) -> PythonChecker:
        """A checker of ``target`` called with ``args``, the schema's other ``keys`` at their one default
        (``runner.checkers.base.conf_of``).

        Raises:
            CheckStartError, ConfigError: as the constructor.
        """
        return cls(conf_of(PythonCheckerConf, {"target": target, "args": list(args), **keys}))

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Call the function once with the artifact's path as a string.

        Raises:
            CheckError: the function raised or called ``sys.exit`` and ``on_error`` is "stop".
        """
        try:
            ok = self.fn(str(artifact) if artifact is not None else None, *self.args)
        except KeyboardInterrupt:
            raise
        except SystemExit as e:
            return self._error(iteration, f"called sys.exit({e.code!r})")
        except Exception as e:
            return self._error(iteration, f"raised {type(e).__name__}: {first_line(e)}")
        if not isinstance(ok, (bool, np.bool_)):  # "False", a generator, a function: truthy, no verdict
            return self._error(iteration, f"returned {type(ok).__name__} {_short(ok)}, not a bool")
        return Verdict(bool(ok), reason=f"{self.target} returned {ok!r}")

    def _error(self, iteration: int, what: str) -> Verdict:
        """The function did not judge the candidate: stop, or a verdict counted apart as an error.

        Raises:
            CheckError: with ``on_error="stop"``.
        """
        return self.on_error.verdict(
            iteration,
            f"{self.target} {what}",
            f"{self.target} {what} on iteration {iteration}: a check that raises has not judged the candidate; "
            "fix the function, or set checker.on_error=fail (or pass) to count such candidates so",
            f"{self.target} {what}",
            what,
        )


def _short(value: object) -> str:
    """``repr(value)``, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
