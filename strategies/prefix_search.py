"""Prefix search: the shortest prefix of an order that gives the target verdict.

Pure: no I/O, no ONNX, no logging. Polygraphy's precision algorithm (``debug precision``):
the marker searches 1..n for the shortest prefix ``order[:i]`` that gives the target, knowing
the whole order does and assuming the empty prefix does not. Same interface as
``strategies.set_search.SetSearch`` (the rounds of ``strategies.search_rounds.RoundSearch``, and
``result``, ``remaining``, ``rounds``, ``label``), so a mode holds either one without branching on which.
"""

from __future__ import annotations

from typing import Callable, FrozenSet, Hashable, List, Optional, Sequence, TypeVar

from strategies.boundary import BoundaryMarker
from strategies.search_rounds import RoundSearch

T = TypeVar("T", bound=Hashable)


class PrefixSearch(RoundSearch[T]):
    """Drives one boundary marker over the prefixes of ``order``.

    Args:
        order: the elements; candidates are ``order[:i]``.
        marker_factory: ``marker_factory(count)`` returns a fresh boundary marker.

    Raises:
        ValueError: when ``order`` is empty.

    Usage, serial: ``while (s := search.next()) is not None: search.step(target(s))``; with k
    workers: ``while sets := search.propose(k): search.step_round([target(s) for s in sets])``;
    then ``result``. A round's sets may be tested at once (``strategies.boundary``'s ``propose``).
    """

    def __init__(self, order: Sequence[T], marker_factory: Callable[[int], BoundaryMarker]):
        self.order: List[T] = list(order)
        self.marker = marker_factory(len(self.order))
        self.rounds = 0
        self.done = False
        self.required: List[T] = []  # a prefix search names no single needed element
        self._round: List[int] = []

    def _propose(self, k: int) -> List[FrozenSet[T]]:
        """Up to ``k`` prefixes to test at once (the marker's ``propose(k)``); empty when the search is over."""
        indices = [] if self.done else self.marker.propose(k)
        if not indices:
            self.done = True
            self.rounds = 1
            return []
        self._round = indices
        return [frozenset(self.order[:i]) for i in indices]

    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round, in order (None: not checked): True when a prefix gave the target."""
        self.marker.step_round(list(zip(self._round, hits)))

    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """True when the verdicts known so far (None: running) decide the round (the marker's ``settled``)."""
        return self.marker.settled(list(zip(self._round, hits)))

    @property
    def result(self) -> FrozenSet[T]:
        """The shortest prefix known to give the target (the whole order until one shorter did)."""
        return frozenset(self.order[: self.marker.boundary])

    def remaining(self) -> int:
        """Tests left, as the marker estimates."""
        return 0 if self.done else self.marker.remaining()

    def label(self, noun: str = "element", position: int = 0) -> str:
        """What the ``position``-th set of the last round is, for the log."""
        index = self._round[position] if position < len(self._round) else 0
        return f"prefix of {index} of {len(self.order)} {noun}s"
