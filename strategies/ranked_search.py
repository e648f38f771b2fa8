"""Ranked search: a small 1-minimal set, built up from a ranking, one needed element per round.

Pure: no I/O, no ONNX, no logging. Used by ``mode=precision marker=minimal`` over the nodes
ranked by the error each introduces in the low precision (``runner.layerwise.ranking``), most
likely needed first.

It is the set search of ``strategies.set_search`` (Junker's QuickXplain rounds: R = elements
shown needed, U = the rest in ranked order, invariant target(R + U)) with a second kind of round
for rankings whose needed elements sit together:

- **sparse round** (as the set search): the marker (galloping) finds the shortest prefix U[:b]
  with target(R + U[:b]); U[b-1] is needed and U[b:] is dropped. About 2 log2(b) tests. The
  marker assumes that R alone misses; a test that missed in the round shows it (R is a subset),
  so R alone is tested only when the round ends at b = 1 without a miss, and if it gives the
  target the search stops with R. (The set search tests R alone before every round.)
- **dense round**: one test of R + U[:-1]. If it loses the target, U[-1] is needed (one test,
  the floor of certifying an element); if not, U[-1] is dropped and the next round is sparse.

A sparse round whose needed element was the last of U (every other element of U was needed
to reach the target) switches to dense rounds, which last while they keep finding needed
elements. k needed elements that a ranking puts first cost about 2 log2(k) + k tests after the
gates, instead of k (2 log2(k) + 1); a few needed elements spread through the ranking cost what
the set search costs. Each needed element is shown needed by a failing test on a superset of
the final set, so with a monotone target the answer is 1-minimal.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Generic, Hashable, List, Optional, Sequence, TypeVar

from strategies.boundary import BoundaryMarker

T = TypeVar("T", bound=Hashable)


class RankedSearch(Generic[T]):
    """Set search over a ranking, with dense rounds where the needed elements sit together.

    Args:
        order: the ranking, most likely needed first.
        marker_factory: ``marker_factory(count)`` returns a fresh boundary marker (minimal: galloping).

    Attributes:
        required: elements shown needed so far.
        rounds: rounds finished (one needed element each).

    Usage: ``while (s := search.next()) is not None: search.step(target(s))``; then ``result``.
    The caller must know that ``target(order)`` holds and ``target(empty)`` does not.
    """

    def __init__(self, order: Sequence[T], marker_factory: Callable[[int], BoundaryMarker]):
        self.rest: List[T] = list(order)
        self.required: List[T] = []
        self.marker_factory = marker_factory
        self.rounds = 0
        self.done = False
        self.dense = False
        self._marker: Optional[BoundaryMarker] = None
        self._pending: Optional[int] = None
        self._kind = ""  # "probe", "dense" or "marker": what the pending test is
        self._missed = False  # a marker test of this round missed: R alone misses too

    @property
    def result(self) -> FrozenSet[T]:
        """The needed elements with what is left of the rest (tested together and giving the
        target); once ``done``, the 1-minimal answer."""
        return frozenset(self.required) | frozenset(self.rest)

    def next(self) -> Optional[FrozenSet[T]]:
        """The next set to test, or None when the search is over."""
        while not self.done:
            if not self.rest:  # R + U = R gave the target (the invariant)
                self.done = True
                break
            if self._marker is not None:
                index = self._marker.next()
                if index is not None:
                    self._kind, self._pending = "marker", index
                    return frozenset(self.required) | frozenset(self.rest[:index])
                if self._marker.boundary == 1 and not self._missed and self.required and self._kind != "probe":
                    self._kind = "probe"
                    return frozenset(self.required)
                self._finish_marker()
                continue
            if self.dense:
                self._kind = "dense"
                return frozenset(self.required) | frozenset(self.rest[:-1])
            self._kind, self._missed = "", False
            self._marker = self.marker_factory(len(self.rest))
        return None

    def step(self, hit: bool) -> None:
        """Feed the verdict for the set last returned by ``next()``: True when it gave the target."""
        if self._kind == "marker":
            assert self._marker is not None and self._pending is not None
            self._marker.step(self._pending, hit)
            self._missed = self._missed or not hit
        elif self._kind == "dense":
            last = self.rest.pop()
            if not hit:
                self.required.append(last)
                self.rounds += 1
            else:
                self.dense = False
        elif self._kind == "probe" and hit:
            self.rest = []
            self._marker = None
            self.done = True

    def _finish_marker(self) -> None:
        assert self._marker is not None
        b = self._marker.boundary
        self.dense = b == len(self.rest) and b > 1
        self.required.append(self.rest[b - 1])
        self.rest = self.rest[: b - 1]
        self._marker = None
        self._kind = ""
        self.rounds += 1

    def remaining(self) -> int:
        """Tests left in this round, estimated (later rounds are unknown)."""
        if self.done:
            return 0
        if self._marker is not None:
            return self._marker.remaining() + 1
        return 1

    def label(self, noun: str = "element") -> str:
        """What the set last returned by ``next()`` is, for the log."""
        if self._kind == "probe":
            return f"the {len(self.required)} needed {noun}(s) alone"
        if self._kind == "dense":
            return f"without the last-ranked of {len(self.rest)} {noun}s left ({len(self.required)} needed so far)"
        return (
            f"round {self.rounds + 1}, ranked prefix {self._pending} of {len(self.rest)} + {len(self.required)} needed"
        )
