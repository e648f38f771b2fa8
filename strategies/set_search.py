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
1-minimal: dropping any one element loses the target. A target need not be monotone (a subgraph's
outputs can hide a fault that a larger one shows), so an answer of ``PRUNE_MAX`` elements or fewer
is then tested without each element in turn, earliest found first, and an element whose removal
keeps the target goes: the answer is 1-minimal by test whatever the target (one check an element).
With a bisect marker a round costs about log2(|U|) + 1 tests, so k needed elements among n cost
about k * (log2(n) + 2) tests; one needed element among 672 costs 11. Without monotonicity every
answer is still a set that was tested and gave the target.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Hashable, List, Optional, Sequence, Tuple, TypeVar

from strategies.boundary import BoundaryMarker
from strategies.search_rounds import RoundSearch

T = TypeVar("T", bound=Hashable)

#: answers of this many elements or fewer are tested without each element once confirmed
PRUNE_MAX = 8


class SetSearch(RoundSearch[T]):
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
        self._round: List[Tuple[str, int]] = []  # the last round: ("probe" or "marker", prefix length)
        self._confirmed = False
        self.best: Optional[FrozenSet[T]] = None
        self._prune: List[T] = []  # elements of the confirmed answer still to be tested without

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

    def _set(self, kind: str, index: int) -> FrozenSet[T]:
        required = frozenset(self.required)
        if kind == "prune":
            return required - {self._prune[0]}
        return required if kind == "probe" else required | frozenset(self.rest[:index])

    def _propose(self, k: int) -> List[FrozenSet[T]]:
        """Up to ``k`` sets to test at once; empty when the search is over.

        A round's sets are the marker's ``propose`` over the prefixes of the rest; the test of
        the required set alone leads the round and shares it with the marker's first ``k - 1``
        (whose verdicts are dropped when it ends the search).
        """
        self._round = []
        if self._prune and not self.done:
            self._round = [("prune", 0)]
            return [self._set("prune", 0)]
        while not self.done:
            if self._probing:
                self._round.append(("probe", 0))
                if k > 1 and self.rest:
                    if self._marker is None:
                        self._marker = self.marker_factory(len(self.rest))
                    self._round += [("marker", i) for i in self._marker.propose(k - 1)]
                break
            if self._marker is None:
                self._start_round()
                continue
            indices = self._marker.propose(k)
            if not indices:
                self._finish_round()
                continue
            self._round = [("marker", i) for i in indices]
            break
        return [self._set(kind, index) for kind, index in self._round]

    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round, in order (None: not checked): True when a set gave the target."""
        tested = [(kind, index, hit) for (kind, index), hit in zip(self._round, hits)]
        if tested and tested[0][0] == "prune":
            if tested[0][2] is None:
                return
            dropped = self._prune.pop(0)
            if tested[0][2]:
                self.required.remove(dropped)
            if len(self.required) < 2:  # never the empty set: one element left is needed (R alone gave the target)
                self._prune = []
            self.done = not self._prune
            return
        for kind, index, hit in tested:
            found = self._set(kind, index)
            if hit and (self.best is None or len(found) < len(self.best)):
                self.best = found
        verdicts: List[Tuple[int, Optional[bool]]] = []
        for kind, index, hit in tested:
            if kind != "probe":
                verdicts.append((index, hit))
            elif hit is None:
                return
            else:
                self._probing = False
                if hit:
                    self.done = self._confirmed = True
                    if 2 <= len(self.required) <= PRUNE_MAX:
                        self._prune, self.done = list(self.required), False
                    return
        if verdicts:
            assert self._marker is not None
            self._marker.step_round(verdicts)

    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """True when the verdicts known so far (None: running) decide the round: the required set
        alone gave the target, or the marker's ``settled``."""
        pairs = list(zip(self._round, hits))
        if pairs and pairs[0][0][0] == "prune":
            return pairs[0][1] is not None
        if pairs and pairs[0][0][0] == "probe":
            if pairs[0][1] is not None:
                return bool(pairs[0][1]) or (self._marker is not None and self._settled(pairs[1:]))
            return False
        return self._settled(pairs)

    def _settled(self, pairs: Sequence[Tuple[Tuple[str, int], Optional[bool]]]) -> bool:
        assert self._marker is not None
        return bool(pairs) and self._marker.settled([(index, hit) for (_, index), hit in pairs])

    def _finish_round(self) -> None:
        assert self._marker is not None
        b = self._marker.boundary
        self.required.append(self.rest[b - 1])
        self.rest = self.rest[: b - 1]
        self._marker = None
        self.rounds += 1
        self._probing = True

    def label(self, noun: str = "element", position: int = 0) -> str:
        """What the ``position``-th set of the last round is, for the log."""
        kind = self._round[position][0] if position < len(self._round) else "probe"
        if kind == "prune":
            return f"the {len(self.required)} needed {noun}s without one, checking the answer is 1-minimal"
        if kind == "probe" or self.done:
            return f"the {len(self.required)} needed {noun}(s) alone"
        return f"round {self.rounds + 1}, searching for needed {noun} {len(self.required) + 1}"

    def remaining(self) -> int:
        """Tests left in this round (plus the probe that ends it); later rounds are unknown."""
        if self.done:
            return 0
        if self._prune:
            return len(self._prune)
        if self._marker is None:
            return 1
        return self._marker.remaining() + 1
