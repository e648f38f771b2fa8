"""The round interface the searches share (prefix, set, ranked): ``propose(k)`` sets to test at once,
``step_round`` their verdicts, ``settled`` whether the verdicts so far decide the round; a serial
run is rounds of one (``next``, ``step``).

Pure: no I/O, no ONNX, no logging.
"""

from __future__ import annotations

import abc
import copy
from typing import FrozenSet, Generic, Hashable, List, Optional, Sequence, TypeVar

T = TypeVar("T", bound=Hashable)


class RoundSearch(Generic[T], abc.ABC):
    """Base of the searches over element sets; subclasses choose a round in ``_propose``."""

    def propose(self, k: int) -> List[FrozenSet[T]]:
        """Up to ``k`` sets to test at once, in the order a serial run would take their verdicts;
        empty when the search is over.

        Raises:
            ValueError: when ``k`` < 1.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self._propose(k)

    @abc.abstractmethod
    def _propose(self, k: int) -> List[FrozenSet[T]]:
        """The next round of at most ``k`` (>= 1) sets."""

    @abc.abstractmethod
    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round, in order (None: not checked): True when a set gave the target."""

    @abc.abstractmethod
    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """True when the verdicts known so far (None: running) decide what ``step_round`` does."""

    def ahead(self, sets: Sequence[FrozenSet[T]], k: int) -> List[List[FrozenSet[T]]]:
        """The rounds that may follow the round of ``sets`` (what ``propose`` returned last): one per
        outcome a monotone target can give, i.e. with the sets taken by size, the ``j`` smallest miss
        and the rest hit, for j = 0 (all hit) to ``len(sets)`` (all miss). Each is what
        ``propose(k)`` returns after that outcome's ``step_round`` (empty: the search would end).
        This search is not changed: each outcome steps a copy.

        A guess for building candidates ahead while the round's checks run, never a verdict; cost:
        ``len(sets) + 1`` copies of the search (linear in its elements).
        """
        by_size = sorted(range(len(sets)), key=lambda i: len(sets[i]))
        rounds: List[List[FrozenSet[T]]] = []
        for misses in range(len(sets) + 1):
            hits: List[Optional[bool]] = [None] * len(sets)
            for rank, i in enumerate(by_size):
                hits[i] = rank >= misses
            fork = copy.deepcopy(self)
            fork.step_round(hits)
            rounds.append(fork.propose(k))
        return rounds

    def next(self) -> Optional[FrozenSet[T]]:
        """The next set to test (a round of one), or None when the search is over."""
        sets = self.propose(1)
        return sets[0] if sets else None

    def step(self, hit: bool) -> None:
        """Feed the verdict for the set last returned by ``next()``: True when it gave the target."""
        self.step_round([hit])
