"""The checker interface: judge one iteration's artifact, return a Verdict."""

from __future__ import annotations

import abc
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar

from runner.candidates import Candidate, Verdict
from runner.errors import ConfigError, first_line
from runner.executors.slot import Slot

if TYPE_CHECKING:
    from runner.checkers.compare.comparison import Comparison
    from runner.context import RunContext


T = TypeVar("T")


class Need(Enum):
    """What the check of a candidate needs made before it runs (``Checker.needs``)."""

    #: its iteration artifact, written first
    file = "file"
    #: its in-memory model (``Candidate.payload``), built where the strategy lives in a parallel run
    model = "model"
    #: neither: it runs as feeds of its search's switched model (``Candidate.switched``)
    nothing = "nothing"


def conf_of(schema: Type[T], keys: Mapping[str, Any]) -> T:
    """A checker's schema (``runner.config.<Name>CheckerConf``) filled from ``keys``: values checked and converted
    by OmegaConf (names as enum members, numbers as numbers), keys left out at their one default.

    Raises:
        ConfigError: a key the schema does not have, or a value of the wrong type.
        omegaconf.errors.MissingMandatoryValue: a mandatory key (``cmd``, ``target``) is not set.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), {k: v for k, v in keys.items() if k != "_target_"})
    except (ConfigKeyError, ValidationError) as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"checker.{key}: {first_line(e)}" if key else f"checker: {first_line(e)}") from None
    made = OmegaConf.to_object(merged)
    assert isinstance(made, schema)
    return made


class Checker(abc.ABC):
    """Judges each iteration. One module per checker in ``runner/checkers/``.

    Attributes:
        output_dir: where a checker that runs programs keeps each check's whole output
            (``<run dir>/checks``); None keeps it in a temporary file.
    """

    output_dir: Optional[Path] = None

    #: the checker's schema (``runner.config``): a checker that has keys takes it whole, ``Checker(conf)``
    #: (``runner.run.assembly`` fills it from the config); None for a checker without keys
    schema: ClassVar[Optional[type]] = None

    #: several checks may run at once (``executor.workers`` > 1); False for a checker that asks a person
    concurrent = True

    #: what to look at when the check passes where it must fail (the model as given, in reduce)
    fix_hint = "check the check command (or its fail_codes/fail_regex) on the model first"

    #: the check runs in the process that calls ``check``; False for a checker that runs a program
    #: (``executor=processes`` is for in-process checks: a program is its own process already)
    in_process = True

    #: the verdict is a function of the candidate's file alone (a program or a function given its path):
    #: a copy holding the same bytes as a file checked this run takes its verdict (``statemachine.same_bytes``).
    #: False where a check judges a candidate by more than its bytes (the compare checker verifies an answer
    #: on more arithmetics) or asks a person
    verdict_by_bytes = False

    #: the check runs the run's model's samples through the candidate (``bind`` needs a model): compare, validate
    reads_model = False

    def bind(self, ctx: RunContext) -> None:
        """Receive the run's shared context before the first check (default: nothing)."""

    def trust_reference(self, ctx: RunContext) -> None:
        """Before a low-precision search: refuse a reference whose own fp32 noise is past the tolerance, so that
        no verdict could tell the low precision from it (default: nothing to measure; ``checker=compare``
        measures, ``runner.checkers.compare.spread``).

        Raises:
            ConfigError: the reference is only noise (a one-line error naming the output and the fix).
        """

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

    def needs(self, candidate: Candidate) -> Need:
        """What the check of ``candidate`` needs made first: its file (the default), its in-memory model
        (``Candidate.payload``), or nothing (it runs as feeds of its search's switched model)."""
        return Need.file

    def compared_tensors(self) -> Optional[Tuple[str, ...]]:
        """The tensors of the full model whose golden values the check holds itself (a ``polygraphy run
        --load-outputs`` file of every tensor), in the file's order, which a reduce candidate should output
        wherever it computes them; None: the check says nothing of the kind (default)."""
        return None

    def comparison(self) -> Optional[Comparison]:
        """How this checker runs and judges a model, for the work that must do the same beside its checks
        (layerwise, reduce's own runs, precision's rankings); None (the default): it compares nothing."""
        return None

    def facts(self) -> Dict[str, Any]:
        """This checker's own fields for ``summary.json`` (none here), as ``Executor.facts`` gives the executor's."""
        return {}

    def close(self) -> None:
        """Release resources (sessions, processes) at the end of the run."""
