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

from typing import Callable, FrozenSet, Hashable, List, Optional, Sequence, TypeVar

from strategies.boundary import BoundaryMarker
from strategies.search_rounds import RoundSearch

T = TypeVar("T", bound=Hashable)


class RankedSearch(RoundSearch[T]):
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
        self._round: List[int] = []  # the last round: prefix lengths, or dense positions
        self._kind = ""  # "probe", "dense" or "marker": what the last round tests
        self._missed = False  # a marker test of this round missed: R alone misses too

    @property
    def result(self) -> FrozenSet[T]:
        """The needed elements with what is left of the rest (tested together and giving the
        target); once ``done``, the 1-minimal answer."""
        return frozenset(self.required) | frozenset(self.rest)

    def _set(self, kind: str, index: int) -> FrozenSet[T]:
        required = frozenset(self.required)
        if kind == "probe":
            return required
        if kind == "dense":  # all but the (index+1)-th from the end: the dense tests before it all missed
            return required | frozenset(self.rest[: -1 - index]) | frozenset(self.rest[len(self.rest) - index :])
        return required | frozenset(self.rest[:index])

    def _propose(self, k: int) -> List[FrozenSet[T]]:
        """Up to ``k`` sets to test at once; empty when the search is over.

        A sparse round's sets are the marker's ``propose(k)``; a dense round proposes the next
        ``k`` dense tests, each assuming the ones before it miss (the ``j``-th leaves out the
        ``j``-th last element of the rest), taken in order up to the first that gives the target.
        """
        self._round = []
        while not self.done:
            if not self.rest:  # R + U = R gave the target (the invariant)
                self.done = True
                break
            if self._marker is not None:
                indices = self._marker.propose(k)
                if indices:
                    self._kind, self._round = "marker", indices
                    break
                if self._marker.boundary == 1 and not self._missed and self.required and self._kind != "probe":
                    self._kind, self._round = "probe", [0]
                    break
                self._finish_marker()
                continue
            if self.dense:
                self._kind, self._round = "dense", list(range(min(k, len(self.rest))))
                break
            self._kind, self._missed = "", False
            self._marker = self.marker_factory(len(self.rest))
        return [self._set(self._kind, index) for index in self._round]

    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round, in order (None: not checked): True when a set gave the target."""
        verdicts = list(zip(self._round, hits))
        if self._kind == "marker":
            assert self._marker is not None
            self._marker.step_round(verdicts)
            self._missed = self._missed or any(hit is False for _, hit in verdicts)
        elif self._kind == "dense":
            for _, hit in verdicts:
                if hit is None:
                    return
                last = self.rest.pop()
                if hit:
                    self.dense = False
                    return
                self.required.append(last)
                self.rounds += 1
        elif self._kind == "probe" and verdicts and verdicts[0][1]:
            self.rest = []
            self._marker = None
            self.done = True

    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """True when the verdicts known so far (None: running) decide the round: the marker's
        ``settled``, or in a dense round a test that gave the target with every one before it known."""
        verdicts = list(zip(self._round, hits))
        if self._kind == "marker":
            assert self._marker is not None
            return self._marker.settled(verdicts)
        if self._kind == "dense":
            for _, hit in verdicts:
                if hit is None:
                    return False
                if hit:
                    return True
        return False

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

    def label(self, noun: str = "element", position: int = 0) -> str:
        """What the ``position``-th set of the last round is, for the log."""
        if self._kind == "probe":
            return f"the {len(self.required)} needed {noun}(s) alone"
        if self._kind == "dense":
            which = "last-ranked" if position == 0 else f"{position + 1}th from last"
            return f"without the {which} of {len(self.rest)} {noun}s left ({len(self.required)} needed so far)"
        prefix = self._round[position] if position < len(self._round) else 0
        return f"round {self.rounds + 1}, ranked prefix {prefix} of {len(self.rest)} + {len(self.required)} needed"
