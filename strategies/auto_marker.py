"""``marker=auto``: bisect or linear, chosen for each search by its size and the run's measured check cost.

Linear (one position a check from the known failure down, ``strategies.linear``) costs a check per position but
never relies on the check being monotone across more than one step; bisect (``strategies.bisect``) costs
``ceil(log2 n)`` checks and assumes it is. Where testing every position is cheap the reliable one is worth it:
``auto`` takes linear when the search has at most ``LINEAR_UP_TO`` positions (bisect saves at most a few checks
there), or when every position times the median check so far fits ``marker.linear_budget_s``; else bisect. A
search's markers are made as it goes (a reduce makes one per needed node), each choosing with the checks measured
by then: the gates' checks come first, so a reduce's first choice knows a check's cost. Each choice is said in the
log.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from runner.check_times import CheckTimes
from strategies.bisect import BisectMarker
from strategies.boundary import BoundaryMarker
from strategies.linear import LinearMarker

log = logging.getLogger(__name__)

#: a search of at most this many positions walks them (bisect would save at most a couple of checks)
LINEAR_UP_TO = 8


class AutoMarker:
    """A marker factory's class: ``AutoMarker(count, times, linear_budget_s)`` is a ``LinearMarker`` or a
    ``BisectMarker`` of ``count`` (module docstring).

    Args:
        count: the positions the search covers (``BoundaryMarker``'s).
        times: the run's check times (``runner.check_times.CheckTimes``); None: the choice is by size alone.
        linear_budget_s: seconds a linear walk over every position may be expected to take (count x the median
            check) for linear to be chosen.

    Raises:
        ValueError: ``count`` < 1 (``BoundaryMarker``).
    """

    #: the assembly hands it the run's ``CheckTimes`` (``times=``)
    takes_check_times = True
    searches_sets = False

    def __new__(  # type: ignore[misc]
        cls, count: int, times: Optional[CheckTimes] = None, linear_budget_s: float = 30.0
    ) -> BoundaryMarker:
        seconds = times.median() if times is not None else None
        linear = count <= LINEAR_UP_TO or (seconds is not None and count * seconds <= linear_budget_s)
        chosen: Any = LinearMarker if linear else BisectMarker
        if count <= LINEAR_UP_TO:
            why = f"{count} positions (at most {LINEAR_UP_TO})"
        elif seconds is None:
            why = f"{count} positions, no check measured yet"
        else:
            sign = "<=" if linear else ">"
            why = f"{count} positions x {seconds:.2g} s a check = {count * seconds:.3g} s {sign} {linear_budget_s:g} s"
        log.info("marker=auto: %s (%s)", "linear" if linear else "bisect", why)
        marker: BoundaryMarker = chosen(count)
        return marker
