"""Group search: a 1-minimal set from a ranking, with checks that follow how many elements are needed.

Pure: no I/O, no ONNX, no logging. Used by ``mode=precision marker=minimal`` over the nodes
ranked by the error each introduces in the low precision (``runner.layerwise.ranking``), most
likely needed first.

Two phases, over a target that holds for the whole ranking and not for the empty set:

1. **Gallop** (the marker, minimal: galloping then bisecting; Bentley & Yao 1976): the shortest
   ranked prefix P = U[:b] that gives the target. U[b-1] is needed (every subset of P without it
   is a subset of the failing prefix U[:b-1]); the ranking past b is dropped. About 2 log2(b) tests.
2. **Group removal from the back** (adaptive group testing, Hwang's generalized binary splitting,
   1972, with the group size learnt as it goes, the way delta debugging's complement removal
   drops chunks): with R the needed elements and U the undecided rest in ranked order, and the
   invariant target(R + U), test R + U without its last g elements (the least likely needed).
   A pass drops the g elements and doubles g. A failure shows the group holds a needed element:
   binary splitting (drop the back half of the group; a pass drops it and leaves the front half
   holding the needed element, a failure narrows to the back half) finds one in log2(g) tests,
   it moves to R, and g halves. Every group is a suffix of U, so U stays a prefix of the ranking.
   g never exceeds what Hwang's rule gives for the d needed elements estimated among U from the
   share seen so far: groups of 2**floor(log2((|U| - d + 1) / d)), one by one when |U| <= 2d - 2.

A ``reorder`` the caller gives ranks the elements again once the gallop sees a ranked prefix of
``REORDER_FROM`` elements or more fail, and the gallop starts over on the new order: a second
ranking that costs more than the first, paid only where the needed elements are many. Where the
error of many elements adds up, the shortest passing prefix sits where the margin is gone, so what
the gallop keeps the removal phase can hardly drop: the ranking decides the answer's size and the
checks (one a kept element there), not the search after it.

k needed elements among n cost about 2 log2(b) + k log2(n/k) + O(k) tests; elements that a
ranking puts first cost 2 log2(k) + k, and a dense prefix (most of it needed) costs about one
test an element, which no group test beats once more than 38% of the elements are needed
(Ungar, 1960). Each needed element is shown needed by a failing test of a superset of the final
set without it, so with a monotone target (any superset of a target set is one) the answer is
1-minimal; without monotonicity it is still a set that was tested and gave the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, FrozenSet, Hashable, List, Optional, Sequence, Tuple, TypeVar

from strategies.boundary import BoundaryMarker, known_before
from strategies.search_rounds import RoundSearch

T = TypeVar("T", bound=Hashable)

#: the size of a failing ranked prefix that calls ``reorder`` (the needed elements are many)
REORDER_FROM = 32


class _Shared:
    """Holds the caller's ``reorder`` so that the copies ``ahead`` makes share it instead of copying
    what it refers to (the strategy, its models)."""

    def __init__(self, fn: Callable[[List[Any]], List[Any]]):
        self.fn = fn

    def __deepcopy__(self, memo: Dict[int, Any]) -> _Shared:
        return self


@dataclass(frozen=True)
class _Removal:
    """Phase 2's state: the undecided elements are ``rest[:undecided]``.

    Attributes:
        undecided: length of the prefix of the ranking still undecided (U).
        split: when > 0, U's last ``split`` elements hold a needed element (their removal failed).
        group: the size of the next group to drop when not splitting.
        found: positions in the ranking of the elements phase 2 has shown needed, in the order found.
    """

    undecided: int
    split: int = 0
    group: int = 1
    found: Tuple[int, ...] = ()
    cleared: int = 0

    def cap(self) -> int:
        """The largest group worth testing (Hwang 1972): with d needed among the n undecided, test one by
        one when n <= 2d - 2, else groups of 2**floor(log2((n - d + 1) / d)); d is estimated from the
        share of needed elements among those decided so far (no cap before 4 are decided)."""
        decided = self.cleared + len(self.found)
        if decided < 4:
            return self.undecided
        needed = self.undecided * (len(self.found) + 1) / (decided + 2)
        if self.undecided <= 2 * needed - 2:
            return 1
        return 2 ** math.floor(math.log2(max(1.0, (self.undecided - needed + 1) / max(needed, 1.0))))

    def needed(self) -> _Removal:
        """U's last element is needed: it leaves U, and the group halves."""
        return replace(
            self,
            undecided=self.undecided - 1,
            split=0,
            group=max(1, self.group // 2),
            found=(*self.found, self.undecided - 1),
        )

    def settle(self) -> _Removal:
        """Apply the deduction that needs no test: a split of one element is a needed element."""
        return self.needed() if self.split == 1 else self

    def drop(self) -> int:
        """How many of U's last elements the next test drops (0: U is empty, the search is over)."""
        if self.split:
            return self.split // 2
        return min(self.group, self.undecided)

    def after(self, dropped: int, hit: bool) -> _Removal:
        """The state after the test that dropped U's last ``dropped`` elements gave ``hit``."""
        if hit:
            state = replace(self, undecided=self.undecided - dropped, cleared=self.cleared + dropped)
            if self.split:
                return replace(state, split=self.split - dropped).settle()
            return replace(state, group=max(1, min(self.group * 2, state.cap())))
        return replace(self, split=dropped).settle()


class GroupSearch(RoundSearch[T]):
    """Gallop to the shortest passing ranked prefix, then drop the rest in learnt-size groups.

    Args:
        order: the ranking, most likely needed first.
        marker_factory: ``marker_factory(count)`` returns a fresh boundary marker for the gallop
            (minimal: galloping); it assumes the empty set misses.
        reorder: ranks the elements again (a permutation of its argument, most likely needed
            first) once a ranked prefix of ``REORDER_FROM`` or more fails; the gallop then starts
            over on it. None: never.

    Raises:
        ValueError: from ``propose``, when ``reorder`` returns no permutation of its argument.

    Attributes:
        required: elements shown needed so far, in the order found.
        rounds: needed elements found so far.

    Usage: ``while (s := search.next()) is not None: search.step(target(s))``; then ``result``;
    with k workers: ``while sets := search.propose(k): search.step_round(verdicts)``. The caller
    must know that ``target(order)`` holds and ``target(empty)`` does not.
    """

    def __init__(
        self,
        order: Sequence[T],
        marker_factory: Callable[[int], BoundaryMarker],
        reorder: Optional[Callable[[List[T]], List[T]]] = None,
    ):
        self.rest: List[T] = list(order)
        #: the ranking as it stands: ``order``, or ``reorder``'s once it ranked again (``rest`` is cut by the gallop)
        self.order: List[T] = list(order)
        self._reorder = _Shared(reorder) if reorder is not None else None  # None once called
        self._forking = False  # True in the copies ``ahead`` steps: they never call ``reorder``
        self._galloped: List[T] = []  # the needed element the gallop found
        self.done = not self.rest
        self._marker_factory = marker_factory
        self._marker: Optional[BoundaryMarker] = marker_factory(len(self.rest)) if self.rest else None
        self._state: Optional[_Removal] = None
        self._round: List[int] = []  # the last round: gallop prefix lengths, or the drops of removal tests

    @property
    def required(self) -> List[T]:
        """The elements shown needed so far, in the order found."""
        found = () if self._state is None else self._state.found
        return self._galloped + [self.rest[i] for i in found]

    @property
    def removing(self) -> bool:
        """Whether the gallop is over and the search drops groups (phase 2)."""
        return self._state is not None

    @property
    def rounds(self) -> int:
        """How many needed elements were found so far."""
        return len(self.required)

    @property
    def result(self) -> FrozenSet[T]:
        """The needed elements with the undecided rest (tested together and giving the target);
        once ``done``, the 1-minimal answer."""
        undecided = self.rest if self._state is None else self.rest[: self._state.undecided]
        return frozenset(self.required) | frozenset(undecided)

    def _removal_set(self, state: _Removal, dropped: int) -> FrozenSet[T]:
        kept = self.rest[: state.undecided - dropped] + [self.rest[i] for i in state.found]
        return frozenset(self._galloped) | frozenset(kept)

    def _plan(self, k: int) -> List[Tuple[_Removal, int]]:
        """Up to ``k`` removal tests, each assuming the ones before it pass: (state, elements dropped)."""
        assert self._state is not None
        plan: List[Tuple[_Removal, int]] = []
        state = self._state
        while len(plan) < k and (dropped := state.drop()) > 0:
            plan.append((state, dropped))
            state = state.after(dropped, True)
        return plan

    def _propose(self, k: int) -> List[FrozenSet[T]]:
        """Up to ``k`` sets to test at once; empty when the search is over.

        While galloping, the marker's ``propose(k)``; then the next ``k`` group removals, each
        assuming the ones before it pass (their verdicts are taken in order up to the first failure).
        """
        self._round = []
        if self.done:
            return []
        if self._reorder is not None and self._marker is not None and self._marker.lo >= REORDER_FROM:
            if self._forking:
                return []  # the order is not known until ``reorder`` runs
            self._rank_again(self._reorder.fn)
        if self._marker is not None:
            indices = self._marker.propose(k)
            if indices:
                self._round = indices
                return [frozenset(self.rest[:i]) for i in indices]
            self._end_gallop()
        plan = self._plan(k)
        if not plan:
            self.done = True
            return []
        self._round = [dropped for _, dropped in plan]
        return [self._removal_set(state, dropped) for state, dropped in plan]

    def _rank_again(self, reorder: Callable[[List[Any]], List[Any]]) -> None:
        """Rank every element with ``reorder`` (once) and start the gallop over on that order."""
        ranked = list(reorder(list(self.rest)))
        if len(ranked) != len(self.rest) or set(ranked) != set(self.rest):
            raise ValueError("reorder must return a permutation of the elements it is given")
        self.rest, self.order, self._reorder = ranked, list(ranked), None
        self._marker = self._marker_factory(len(self.rest))

    def _end_gallop(self) -> None:
        assert self._marker is not None
        b = self._marker.boundary
        self._galloped = [self.rest[b - 1]]
        self.rest = self.rest[: b - 1]
        self._marker = None
        self._state = _Removal(undecided=len(self.rest))

    def ahead(self, sets: Sequence[FrozenSet[T]], k: int) -> List[List[FrozenSet[T]]]:
        """``RoundSearch.ahead``, its copies never calling ``reorder`` (a round past it is not guessed)."""
        self._forking = True
        try:
            return super().ahead(sets, k)
        finally:
            self._forking = False

    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round, in order (None: not checked): True when a set gave the target."""
        if self._marker is not None:
            self._marker.step_round(list(zip(self._round, hits)))
            return
        if self._state is None:
            return
        state = self._state
        for dropped, hit in zip(self._round, hits):
            if hit is None:
                break
            state = state.after(dropped, hit)
            if not hit:  # the later tests assumed a pass
                break
        self._state = state
        self.done = state.undecided == 0

    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """True when the verdicts known so far (None: running) decide the round: the marker's
        ``settled`` while galloping, else a failure with every test before it known."""
        if self._marker is not None:
            return self._marker.settled(list(zip(self._round, hits)))
        return known_before(hits, False)

    def remaining(self) -> int:
        """Tests left, estimated: the gallop's, then a removal test per undecided element at most
        (fewer where groups drop together)."""
        if self.done:
            return 0
        if self._marker is not None:
            return self._marker.remaining() + 1
        assert self._state is not None
        return max(1, math.ceil(math.log2(max(self._state.split, 1))) + (1 if not self._state.split else 0))

    def label(self, noun: str = "element", position: int = 0) -> str:
        """What the ``position``-th set of the last round is, for the log."""
        if self._state is None:
            prefix = self._round[position] if position < len(self._round) else 0
            return f"ranked prefix {prefix} of {len(self.rest)} {noun}s"
        dropped = self._round[position] if position < len(self._round) else 0
        return (
            f"without the last {dropped} of {self._state.undecided} undecided {noun}s "
            f"({len(self.required)} needed so far)"
        )
