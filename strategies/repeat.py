"""``mode=repeat``: run the same check again and again until ``until`` is met.

For flaky failures: each run's artifacts are sorted into good/ or bad/, so the user can diff them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from runner.candidates import Candidate
from runner.checkers.command import CommandChecker
from runner.context import RunContext
from runner.errors import ModelError
from strategies.mode_keys import RepeatKeys
from strategies.until import Until, UntilStrategy

log = logging.getLogger(__name__)


KEYS = RepeatKeys


class RepeatStrategy(UntilStrategy):
    """Produces the same (artifact-less) candidate each iteration until ``until`` is met.

    Args:
        until: the stop condition.
        ctx: the run context; with ``model=``, its model is handed to in-process checkers each run
            (``checker=compare`` checks a backend for nondeterministic outputs), loaded on first use.
    """

    artifact_suffix = ""

    def __init__(self, until: Until, ctx: Optional[RunContext] = None):
        super().__init__(until)
        self.ctx = ctx if ctx is not None and ctx.model_path is not None else None

    @classmethod
    def create(cls, ctx: RunContext, keys: RepeatKeys, *, checker: Any = None, marker: Any = None) -> RepeatStrategy:
        """Build from the mode's keys (the run's checker and no marker are not its concern).

        Raises:
            ConfigError: when ``until`` is missing or invalid. A check command naming ``{artifact}`` with no
                ``model=`` is warned of: no file is written there (the check may write one); so are ``inputs=``,
                ``data_loader=`` and ``golden=`` with a checker that compares nothing in-process (not read).
            ModelError: when ``model=`` is given but is not a file (not ONNX: at the first check
                that loads it).
        """
        parsed = Until.parse(keys.until, "repeat")
        if ctx.model_path is not None and not Path(ctx.model_path).is_file():
            raise ModelError(
                f"model={ctx.model_path}: no such file; check the path (mode=repeat does not need a model)"
            )
        if ctx.model_path is None and isinstance(checker, CommandChecker) and checker.names_artifact:
            log.warning(
                "checker.cmd names {artifact}, but mode=repeat without model= writes no file there: the check is "
                "told a path where nothing is until it writes one (give model=FILE for the model's copy)"
            )
        # the checkers that run the model read its inputs (compare, validate); only compare reads golden values
        reads_inputs = checker is not None and checker.reads_model
        given = (
            ("inputs", ctx.inputs, reads_inputs),
            ("data_loader", ctx.data_loader, reads_inputs),
            ("golden", ctx.golden, checker is not None and checker.comparison() is not None),
        )
        unread = [f"{key}=" for key, value, read in given if value and not read]
        if unread:
            log.warning(
                "%s not read: mode=repeat hands the check the model as it is, and only the checkers that run it "
                "(checker=compare, checker=validate) read inputs, and only checker=compare golden values; drop %s",
                " and ".join(unread),
                "them" if len(unread) > 1 else "it",
            )
        return cls(parsed, ctx)

    def make(self, n: int) -> Candidate:
        """Run number ``n``: the same check again (the model, loaded once, for in-process checkers)."""
        ctx = self.ctx
        return Candidate(
            key=f"run:{n}", label=f"run {n}", info={"run": n}, payload=(lambda: ctx.model) if ctx is not None else None
        )
