"""A checker built from its group's keys, as a run and the API's ``run_check`` both build it."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Type

from hydra.utils import get_class, instantiate

from runner.checkers.base import Checker, conf_of


def make_checker(options: Mapping[str, Any], isolate: bool = False, timeout_s: Optional[float] = None) -> Checker:
    """The checker ``options["_target_"]`` names, given its schema whole (``Checker.schema``, filled by
    ``runner.checkers.base.conf_of``), in a child process with ``isolate`` (``runner.checkers.isolated``).

    Args:
        options: the checker group's keys as plain values, ``_target_`` included (``runner.run.plan.CheckerPlan``:
            ``isolate`` and ``timeout_s`` taken out).
        isolate: check in a child process. timeout_s: seconds an isolated check may take, or None.

    Raises:
        omegaconf.errors.MissingMandatoryValue: a mandatory key is not set (the caller says which, and how).
        ConfigError: a key the schema does not have, or a value of the wrong type; what the constructor raises.
    """
    cls: Type[Checker] = get_class(options["_target_"])
    build: Callable[..., Checker] = cls  # a checker with a schema takes it whole
    checker = build(conf_of(cls.schema, options)) if cls.schema is not None else instantiate(dict(options))
    if isolate:
        from runner.checkers.isolated import IsolatedChecker

        return IsolatedChecker(checker, timeout_s)
    return checker
