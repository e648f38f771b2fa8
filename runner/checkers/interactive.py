"""The interactive checker: ask the user at the terminal whether each iteration passed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, TextIO

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker
from runner.errors import CheckStartError
from runner.executors.slot import Slot


class InteractiveChecker(Checker):
    """Asks "Did iteration N pass? [y/n]" on the terminal and waits for y or n.

    Args:
        stdin: where answers come from (default ``sys.stdin``); must be a terminal.
        stdout: where the question goes (default ``sys.stdout``).

    Raises:
        CheckStartError: when there is no terminal to ask (it would otherwise hang).
    """

    def __init__(self, stdin: Optional[TextIO] = None, stdout: Optional[TextIO] = None):
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        if self.stdin is None or not self.stdin.isatty():
            raise CheckStartError(
                "checker=interactive needs a terminal to ask on, and standard input is not one; "
                "run in a terminal or use checker=command 'checker.cmd=\"...\"'"
            )

    concurrent = False  # one question at a time

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Ask until the answer is y/yes or n/no; end of input raises CheckStartError."""
        where = f" ({artifact})" if artifact is not None else ""
        while True:
            self.stdout.write(f"Did iteration {iteration} pass{where}? [y/n] ")
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                raise CheckStartError(
                    "the terminal closed while waiting for a y/n answer; run again and answer each question"
                )
            answer = line.strip().lower()
            if answer in ("y", "yes"):
                return Verdict(True, reason="user said yes")
            if answer in ("n", "no"):
                return Verdict(False, reason="user said no")
