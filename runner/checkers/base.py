"""The checker interface: judge one iteration's artifact, return a Verdict."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import TYPE_CHECKING, FrozenSet, Optional

from runner.candidates import Candidate, Verdict
from runner.executors.slot import Slot

if TYPE_CHECKING:
    from runner.context import RunContext


class Checker(abc.ABC):
    """Judges each iteration. One module per checker in ``runner/checkers/``.

    Attributes:
        output_dir: where a checker that runs programs keeps each check's whole output
            (``<run dir>/checks``); None keeps it in a temporary file.
    """

    output_dir: Optional[Path] = None

    #: the checker runs the candidate's in-memory model (``Candidate.payload``): a parallel run builds
    #: it before the check, in the runner's thread
    uses_payload = False

    #: several checks may run at once (``executor.workers`` > 1); False for a checker that asks a person
    concurrent = True

    #: what to look at when the check passes where it must fail (the model as given, in reduce)
    fix_hint = "check the check command (or its fail_codes/fail_regex) on the model first"

    #: the check runs in the process that calls ``check``; False for a checker that runs a program
    #: (``executor=processes`` is for in-process checks: a program is its own process already)
    in_process = True

    def bind(self, ctx: RunContext) -> None:
        """Receive the run's shared context before the first check (default: nothing)."""

    @abc.abstractmethod
    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """Check one candidate.

        Args:
            artifact: the iteration artifact's path (for modes that write none, where the check may
                write one itself); None only when a caller has no path at all.
            iteration: the 1-based iteration number.
            candidate: the candidate (its ``payload`` may hold an in-memory model).
            slot: where the check runs (worker, GPU, cancel flag), or None in a serial run's own
                thread. A checker that runs a program gives it ``slot.env()`` and stops it, raising
                ``runner.executors.slot.CheckCancelled``, once ``slot.cancelled()``.

        Returns:
            The verdict; ``passed`` is False when the candidate shows the failure.
        """

    def runs_switched(self, candidate: Candidate) -> bool:
        """Whether the check of ``candidate`` runs it as feeds of its search's switched model
        (``Candidate.switched``), building neither its model nor reading its artifact (default: no)."""
        return False

    def compared_tensors(self) -> Optional[FrozenSet[str]]:
        """The tensors of the full model whose golden values the check holds itself (a ``polygraphy run
        --load-outputs`` file of every tensor), which a reduce candidate should output wherever it computes
        them; None: the check says nothing of the kind (default)."""
        return None

    def reads_artifact(self, candidate: Candidate) -> bool:
        """Whether the check of ``candidate`` reads its iteration artifact, so that the file must be
        written first (default: yes; an in-process checker that runs ``Candidate.payload`` does not)."""
        return True

    def close(self) -> None:
        """Release resources (sessions, processes) at the end of the run."""
