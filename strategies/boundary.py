"""The shared part of the markers: a boundary search between a known miss and a known hit.

Pure: no I/O, no ONNX, no logging. A marker searches 0..count for the smallest index at which
a monotone predicate holds, knowing it holds at ``count`` and assuming it does not at 0.
Subclasses choose the order of the tests (``next``) and estimate what remains.
"""

from __future__ import annotations

import abc
from typing import Any, Iterable, List, Optional, Sequence, Tuple


class BoundaryMarker(abc.ABC):
    """Bookkeeping for a boundary search.

    Args:
        count: the predicate is known to hold at ``count`` and assumed not to hold at 0.

    Attributes:
        lo: largest index known not to hold.
        hi: smallest index known to hold (the boundary, once ``next()`` returns None).

    Raises:
        ValueError: when ``count`` < 1.
    """

    #: whether a mode should use this marker for a set search (see strategies/set_search.py)
    searches_sets = False

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.lo = 0
        self.hi = count

    @abc.abstractmethod
    def next(self) -> Optional[int]:
        """The next index to test, or None when ``hi`` is the boundary."""

    @abc.abstractmethod
    def remaining(self) -> int:
        """Estimated tests left."""

    def step(self, index: int, hit: bool) -> None:
        """Record whether the predicate held at ``index``."""
        if hit:
            self.hi = min(self.hi, index)
        else:
            self.lo = max(self.lo, index)

    def propose(self, k: int) -> List[int]:
        """Up to ``k`` indices to test at once (one speculative round for ``k`` workers), in the
        order a serial run would test them; empty when the boundary is known. Subclasses choose
        the round in ``_propose``; the default is the serial marker's one next index.

        Raises:
            ValueError: when ``k`` < 1.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self._propose(k)

    def _propose(self, k: int) -> List[int]:
        index = self.next()
        return [] if index is None else [index]

    def _split(self, k: int) -> List[int]:
        """``k`` indices splitting the open gap (lo, hi) into ``k + 1`` near-equal parts, ascending:
        a (k+1)-ary search step (for k = 1, bisect's midpoint); every index of the gap when it holds
        ``k`` or fewer; empty when the boundary is known."""
        gap = self.hi - self.lo
        if gap <= 1:
            return []
        return sorted({self.lo + (gap * j) // (k + 1) for j in range(1, k + 1)} - {self.lo, self.hi})

    def step_round(self, verdicts: Sequence[Tuple[int, Optional[bool]]]) -> None:
        """Record a round's verdicts, ``(index, hit)`` (``hit`` None: not checked, e.g. cancelled).

        Taken in ascending index up to the first hit, as a serial search would meet them: misses
        raise ``lo``, the first hit is ``hi``. A miss above a hit (a check that is not monotone)
        is ignored, so ``lo < hi`` always holds. A missing verdict ends what can be taken.
        """
        for index, hit in sorted(verdicts, key=lambda v: v[0]):
            if hit is None:
                return
            self.step(index, hit)
            if hit:
                return

    def settled(self, verdicts: Sequence[Tuple[int, Optional[bool]]]) -> bool:
        """True when the verdicts known so far (None: still running) already decide what
        ``step_round`` does, so the checks still running can be cancelled: a hit below which
        every verdict is known (the indices above it are ignored)."""
        return known_before([hit for _, hit in sorted(verdicts, key=lambda v: v[0])], True)

    @property
    def boundary(self) -> int:
        """The smallest index known to hold."""
        return self.hi


def known_before(hits: Iterable[Optional[bool]], verdict: bool) -> bool:
    """Whether ``hits`` (in the order a serial search meets them; None: still running) hold ``verdict`` with every
    verdict before its first one known: what the ``settled`` of a search that stops at the first such verdict asks."""
    for hit in hits:
        if hit is None:
            return False
        if bool(hit) == verdict:
            return True
    return False


def marker_name(factory: Any) -> str:
    """The class name of a marker factory (a class, or a ``functools.partial`` of one from ``instantiate``)."""
    target = getattr(factory, "func", factory)
    return getattr(target, "__name__", str(target))


def searches_sets(factory: Any) -> bool:
    """Whether a marker factory's class is meant for a set search (``BoundaryMarker.searches_sets``)."""
    return bool(getattr(getattr(factory, "func", factory), "searches_sets", False))
