"""Set search: find a small set of elements that, kept together, still gives the target verdict.

Pure: no I/O, no ONNX, no logging; shared by ``mode=reduce`` (the nodes a failure needs) and
``mode=precision`` with ``marker=minimal`` (the nodes that must stay in high precision).

Algorithm (one necessary element per round, as in Junker's QuickXplain, 2004, and the
"binary search for a culprit" of adaptive group testing):

    R = required elements found so far, U = the rest, in the given order;
    invariant: target(R + U) holds.
    each round:
        if R is not empty and target(R) holds: stop, the answer is R;
        find with the marker the smallest i such that target(R + U[:i]) holds;
        then U[i-1] is needed given R + U[:i-1]: add it to R, drop U[i-1:].

With a monotone target (any superset of a target set is a target set) the answer is
1-minimal: dropping any one element loses the target. With a bisect marker a round costs
about log2(|U|) + 1 tests, so k needed elements among n cost about k * (log2(n) + 1)
tests; one needed element among 672 costs 11. Without monotonicity every answer is still a
set that was tested and gave the target.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Generic, Hashable, List, Optional, Sequence, TypeVar

from strategies.boundary import BoundaryMarker

T = TypeVar("T", bound=Hashable)


class SetSearch(Generic[T]):
    """Drives a marker round by round over a universe of elements.

    Args:
        universe: the elements, in the order prefixes are taken (put likely-needed ones first
            for galloping markers; for reduce, topological order).
        marker_factory: ``marker_factory(count)`` returns a fresh boundary marker.
        required: elements known to be needed from the start.

    Usage: ``while (s := search.next()) is not None: search.step(target(s))``; then ``result``.
    The caller must know that ``target(required + universe)`` holds.
    """

    def __init__(
        self, universe: Sequence[T], marker_factory: Callable[[int], BoundaryMarker], required: Sequence[T] = ()
    ):
        self.required: List[T] = list(required)
        known = set(self.required)
        self.rest: List[T] = [u for u in universe if u not in known]
        self.marker_factory = marker_factory
        self.rounds = 0
        self.done = False
        self._marker: Optional[BoundaryMarker] = None
        self._probing = bool(self.required)
        self._pending: Optional[int] = None
        self._last: Optional[FrozenSet[T]] = None
        self._confirmed = False
        self.best: Optional[FrozenSet[T]] = None

    @property
    def result(self) -> Optional[FrozenSet[T]]:
        """The answer once ``done``: the required set when it was tested and gave the target,
        else the smallest tested set that gave it (only with a non-monotone target)."""
        return frozenset(self.required) if self._confirmed else self.best

    @property
    def probing(self) -> bool:
        """True when the next set is the required set alone (the test that may end the search)."""
        return self._probing

    def _start_round(self) -> None:
        if not self.rest:
            self.done = True
            return
        self._marker = self.marker_factory(len(self.rest))

    def next(self) -> Optional[FrozenSet[T]]:
        """The next set to test, or None when the search is over."""
        while not self.done:
            if self._probing:
                self._pending = None
                self._last = frozenset(self.required)
                return self._last
            if self._marker is None:
                self._start_round()
                continue
            index = self._marker.next()
            if index is None:
                self._finish_round()
                continue
            self._pending = index
            self._last = frozenset(self.required) | frozenset(self.rest[:index])
            return self._last
        return None

    def step(self, hit: bool) -> None:
        """Feed the verdict for the set last returned by ``next()``: True when it gave the target."""
        if hit and self._last is not None and (self.best is None or len(self._last) < len(self.best)):
            self.best = self._last
        if self._probing:
            self._probing = False
            if hit:
                self.done = self._confirmed = True
            return
        assert self._marker is not None and self._pending is not None
        self._marker.step(self._pending, hit)

    def _finish_round(self) -> None:
        assert self._marker is not None
        b = self._marker.boundary
        self.required.append(self.rest[b - 1])
        self.rest = self.rest[: b - 1]
        self._marker = None
        self.rounds += 1
        self._probing = True

    def label(self, noun: str = "element") -> str:
        """What the set last returned by ``next()`` is, for the log."""
        if self._probing or self.done:
            return f"the {len(self.required)} needed {noun}(s) alone"
        return f"round {self.rounds + 1}, searching for needed {noun} {len(self.required) + 1}"

    def remaining(self) -> int:
        """Tests left in this round (plus the probe that ends it); later rounds are unknown."""
        if self.done:
            return 0
        if self._marker is None:
            return 1
        return self._marker.remaining() + 1
