"""``summary.json``: what a run did and found, one typed record filled as the run goes and written once.

The file is the user contract (scripts read its fields): ``Summary.as_json`` gives the same fields,
in the same order, as before the record was typed: the mode's own answer fields (``Strategy.result``)
sit after the counters of checks, and a field that does not apply to a run is left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class Summary:
    """One run's summary.

    Attributes:
        mode: the mode's name.
        status: "ok", "interrupted", or the error line ("error: ...", an ``AnswerNotVerifiedError``'s status).
        iterations, checks, reused: iterations taken, checks run, verdicts reused from a replay.
        answer: the mode's fields (``Strategy.result()``: kept nodes, the reduced model, ...).
        last_check_outputs: the compare checker's errors per output at the last check.
        replay: the replay file written, once it exists.
        error: the error's text (answer not verified, a check that never passed).
        answer_verified: the check of the written answer, when it did not give the search's verdict.
        check_output_tail: the last check's output (a check that never passed).
        counters: the lifecycle's counters (``check_s``, ``errors``, ``crashes``, ``rounds``, ``workers``,
            ``executor``, ``cancelled``, ``switched_checks``) and the executor's facts, once a lifecycle was built.
        reused_from_other_identity: verdicts reused from a replay of another identity.
        wall_s: seconds from ``started`` to ``finish``.
        started: ``time.monotonic()`` at the run's start (not written).
    """

    mode: str
    status: str = "ok"
    iterations: int = 0
    checks: int = 0
    reused: int = 0
    answer: Dict[str, Any] = field(default_factory=dict)
    last_check_outputs: Optional[Any] = None
    replay: Optional[str] = None
    error: Optional[str] = None
    answer_verified: Optional[Dict[str, Any]] = None
    check_output_tail: Optional[str] = None
    counters: Dict[str, Any] = field(default_factory=dict)
    reused_from_other_identity: int = 0
    wall_s: Optional[float] = None
    started: float = field(default_factory=time.monotonic)

    def finish(self) -> None:
        """Set ``wall_s``."""
        self.wall_s = round(time.monotonic() - self.started, 3)

    def as_json(self) -> Dict[str, Any]:
        """``summary.json``'s object."""
        out: Dict[str, Any] = {
            "mode": self.mode,
            "status": self.status,
            "iterations": self.iterations,
            "checks": self.checks,
            "reused": self.reused,
        }
        out.update(self.answer)
        optional = {
            "last_check_outputs": self.last_check_outputs,
            "replay": self.replay,
            "error": self.error,
            "answer_verified": self.answer_verified,
            "check_output_tail": self.check_output_tail,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out.update(self.counters)
        if self.reused_from_other_identity:
            out["reused_from_other_identity"] = self.reused_from_other_identity
        if self.wall_s is not None:
            out["wall_s"] = self.wall_s
        return out
