"""The interactive checker: ask the user whether each iteration passed, on the terminal or from a pipe."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, TextIO

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker
from runner.errors import CheckStartError
from runner.executors.slot import Slot

#: answers that mean the iteration passed / failed (y/n, and Polygraphy's p/f)
PASSED = frozenset({"y", "yes", "p", "pass", "passed"})
FAILED = frozenset({"n", "no", "f", "fail", "failed"})


class InteractiveChecker(Checker):
    """Asks "Did iteration N pass? [y/n]" and reads y or n, one line per question: typed on a
    terminal, or from a pipe or file, as Polygraphy's interactive mode reads them
    (``printf 'y\\nn\\n' | python -m runner ... checker=interactive``), which makes interactive runs
    scriptable. Answers read from a pipe are echoed after the question.

    Args:
        stdin: where answers come from (default ``sys.stdin``).
        stdout: where the question goes (default ``sys.stdout``).

    Raises:
        CheckStartError: when there is no standard input at all.
    """

    fix_hint = "answer that the model as given fails (n, or f) when it does"

    def __init__(self, stdin: Optional[TextIO] = None, stdout: Optional[TextIO] = None):
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        if self.stdin is None:
            raise CheckStartError(
                "checker=interactive reads y/n answers from standard input, and there is none; "
                "run in a terminal, pipe the answers in, or use checker=command 'checker.cmd=\"...\"'"
            )
        self.piped = not self.stdin.isatty()

    concurrent = False  # one question at a time

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Ask until the answer is y/yes/p/pass or n/no/f/fail (Polygraphy's p/f too; other lines ask again).

        Raises:
            CheckStartError: standard input ended before an answer (a closed terminal, or a pipe
                that gave fewer answers than there were checks).
        """
        where = f" ({artifact})" if artifact is not None else ""
        while True:
            self.stdout.write(f"Did iteration {iteration} pass{where}? [y/n] ")
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                where_from = "standard input ended" if self.piped else "the terminal closed"
                raise CheckStartError(
                    f"{where_from} while waiting for a y/n answer to iteration {iteration}; give one answer per "
                    "check (a pipe: one line each) and resume with replay.load= to keep the answers given"
                )
            answer = line.strip().lower()
            if self.piped:
                self.stdout.write(line if line.endswith("\n") else line + "\n")
            if answer in PASSED:
                return Verdict(True, reason="user said yes")
            if answer in FAILED:
                return Verdict(False, reason="user said no")
