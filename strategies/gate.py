"""A gate: a check outside the search whose verdict the run relies on (``strategies.onnx_search``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from runner.candidates import Candidate, Verdict


@dataclass
class Gate:
    """A check outside the search whose verdict the run relies on.

    Attributes:
        make: builds the gate's candidate.
        expect_pass: the verdict the run needs.
        otherwise: called with the verdict when it differs: raises to stop the run, or adjusts the
            strategy (and may queue another gate).
        then: called with the verdict when it is the expected one (default nothing).
    """

    make: Callable[[], Candidate]
    expect_pass: bool
    otherwise: Callable[[Verdict], None]
    then: Optional[Callable[[Verdict], None]] = None
