"""Progress on the terminal: iteration, last verdict, estimated iterations remaining, rounds and checks
running (tqdm)."""

from __future__ import annotations

import sys
from typing import Optional

from tqdm import tqdm


class Progress:
    """A tqdm bar on stderr whose total is "done so far + the strategy's estimate of what remains".

    Args:
        mode: the mode's name, shown as the bar's description.
        enabled: False turns the bar off (e.g. under ``verbose=true`` logging).
    """

    def __init__(self, mode: str, enabled: bool = True):
        self.bar = tqdm(desc=mode, unit="iter", file=sys.stderr, disable=not enabled, dynamic_ncols=True, leave=True)

    def update(
        self,
        iteration: int,
        verdict: str,
        remaining: Optional[int],
        checks: int,
        rounds: Optional[int] = None,
        in_flight: Optional[int] = None,
    ) -> None:
        """Advance to ``iteration`` (verdicts taken); show the last verdict, the checks, the remaining
        estimate and, in a parallel run, the rounds and the checks running now."""
        if remaining is not None:
            self.bar.total = iteration + max(remaining, 0)
        parallel = "" if rounds is None else f" rounds={rounds} running={in_flight or 0}"
        self.bar.set_postfix_str(
            f"last={verdict} checks={checks}{parallel} left~{remaining if remaining is not None else '?'}",
            refresh=True,
        )
        self.bar.update(iteration - self.bar.n)

    def close(self) -> None:
        """Finish the bar."""
        self.bar.close()
