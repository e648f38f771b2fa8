"""``artifacts.iter_info``: the JSON file a check reads to learn what it checks, as Polygraphy's
``--iter-info`` file: written before each check (or round), removed once the verdicts are in, so a
check never reads another iteration's info."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from runner.jsonio import write_json_atomic
from statemachine.rounds import Pending


class IterInfo:
    """The ``iter_info`` file of a run.

    Args:
        path: where it goes, or None for a run without one (every method then does nothing).
        iter_artifact: the iteration artifact's path, named when a pending check has none of its own.
    """

    def __init__(self, path: Optional[Path], iter_artifact: Path):
        self.path, self.iter_artifact = path, iter_artifact

    def write(self, state: Dict[str, Any], pending: Optional[Pending], round_: Sequence[Pending]) -> None:
        """Write it before a check: the mode's ``state`` and one iteration (``pending``), or, before
        a round of several checks (``pending`` None), the round's checks without a verdict
        (``in_flight``)."""
        if self.path is None:
            return
        info: Dict[str, Any] = {"state": state}
        if pending is not None:
            candidate = pending.candidate
            info.update(
                iteration=pending.iteration,
                artifact=str(pending.artifact or self.iter_artifact),
                candidate={"key": candidate.key, "label": candidate.label, **candidate.info},
            )
        else:
            info["in_flight"] = [
                {"iteration": p.iteration, "artifact": str(p.artifact), "label": p.candidate.label}
                for p in round_
                if p.verdict is None
            ]
        write_json_atomic(self.path, info)

    def clear(self) -> None:
        """Remove it once an iteration (a round) has its verdicts, or the run stops."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
