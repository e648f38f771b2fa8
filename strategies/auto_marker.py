"""``marker=auto``: bisect or linear, whichever a search is expected to finish sooner, by its size and what a
candidate has cost the run so far.

Linear (one position a check from the known failure down, ``strategies.linear``) takes about half the positions
in checks and never relies on the check being monotone across more than one step; bisect
(``strategies.bisect``) takes ``ceil(log2(n + 1))`` and assumes it is. A candidate costs the same to either
marker, and that cost is the candidate's whole wall: building or extracting it, writing it, the check and sorting
its files (``runner.check_times.CheckTimes.candidate_median``), not the check alone; a check of a millisecond
still costs a tenth of a second a candidate on the README's classifier, where judging by the check walked 163
positions in 17.2 s against bisect's 11 in 3.4 s. So ``auto`` takes linear only where its expected checks are no
more than bisect's (a search of at most 5 positions), which never has the longer expected wall, and says both
figures in its log line. A search's markers are made as it goes (a reduce makes one per needed node), each with
the costs measured by then.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from runner.check_times import CheckTimes
from strategies.bisect import BisectMarker
from strategies.boundary import BoundaryMarker
from strategies.linear import LinearMarker

log = logging.getLogger(__name__)


def expected_checks(count: int) -> tuple[float, int]:
    """(linear's expected checks over ``count`` positions, bisect's checks): a boundary equally likely anywhere
    takes linear ``(count + 1) / 2`` on average; bisect ``ceil(log2(count + 1))``."""
    return (count + 1) / 2, max(1, math.ceil(math.log2(count + 1)))


class AutoMarker:
    """A marker factory's class: ``AutoMarker(count, times)`` is a ``LinearMarker`` or a ``BisectMarker`` of
    ``count`` (module docstring).

    Args:
        count: the positions the search covers (``BoundaryMarker``'s).
        times: the run's check times (``runner.check_times.CheckTimes``), for the log line's seconds; None: the
            figures are in checks alone.

    Raises:
        ValueError: ``count`` < 1 (``BoundaryMarker``).
    """

    #: the assembly hands it the run's ``CheckTimes`` (``times=``)
    takes_check_times = True
    searches_sets = False

    def __new__(cls, count: int, times: Optional[CheckTimes] = None) -> BoundaryMarker:  # type: ignore[misc]
        walk, halve = expected_checks(count)
        linear = walk <= halve
        cost = times.candidate_median() if times is not None else None
        check = times.median() if times is not None else None
        if cost is None:
            figures = f"linear ~{walk:g} checks, bisect {halve}; no candidate measured yet"
        else:
            figures = (
                f"linear ~{walk:g} checks x {cost:.3g} s = {walk * cost:.3g} s, bisect {halve} = {halve * cost:.3g} s; "
                f"a candidate costs {cost:.3g} s whole" + (f", its check {check:.3g} s" if check is not None else "")
            )
        log.info("marker=auto: %s (%d positions: %s)", "linear" if linear else "bisect", count, figures)
        chosen: Any = LinearMarker if linear else BisectMarker
        marker: BoundaryMarker = chosen(count)
        return marker
