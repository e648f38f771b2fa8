"""Exchange: a smaller answer than the 1-minimal one, by trading two of its elements for one.

Pure: no I/O, no ONNX, no logging. Wraps the search that finds the 1-minimal answer (``GroupSearch``,
``TiedSearch``) in ``mode=precision marker=minimal``: once it is done, with A its answer, test
``A - {a, b} + {c}`` for pairs of A (the least likely needed first, by the ranking) and elements c
outside A (the most likely needed first, the ranking's first ``width`` outside A). A set that gives
the target becomes the answer, one element smaller; it is then tested without each element in turn
(the least likely needed first), a pass dropping that element, so that the answer is 1-minimal again;
and trading starts over on it. It stops when no trade is left or ``budget`` tests are spent.

This is the 2-for-1 move of a local search (a swap neighbourhood, as in the "exchange" step of
sequential feature selection, Pudil et al. 1994, floating search): a 1-minimal set need not be a
minimum one, and post-training quantization tools that revert nodes in sensitivity order (NNCF's
accuracy control) find answers that no drop-one test shortens but another set half the size beats.
What it guarantees: the answer is never larger than the inner search's, every answer is a set that was
tested and gave the target, and with a monotone target it is 1-minimal; a minimum set is not promised.
"""

from __future__ import annotations

import itertools
from typing import Callable, Dict, FrozenSet, Hashable, List, Optional, Sequence, Tuple, TypeVar

from strategies.boundary import known_before
from strategies.precision.group_search import GroupSearch
from strategies.search_rounds import RoundSearch

T = TypeVar("T", bound=Hashable)

#: elements outside the answer tried in each trade (the ranking's first, outside the answer)
WIDTH = 4


class ExchangeSearch(RoundSearch[T]):
    """The inner search, then trades of two answer elements for one outside it, within ``budget`` tests.

    Args:
        inner: the search that finds the 1-minimal answer; it runs first, unchanged.
        ranking: returns the current ranking of every element (most likely needed first), asked once the
            inner search is done (its second ranking, when it made one).
        budget: tests the trades and their drop-one tests may take; 0: none (the inner search alone).
        width: elements outside the answer tried in each trade.

    Attributes:
        trades: trades that gave the target (each made the answer one element smaller, or more).
        spent: tests taken after the inner search.
        started: the inner search's answer size once it is done, else None.
    """

    def __init__(self, inner: GroupSearch[T], ranking: Callable[[], Sequence[T]], budget: int, width: int = WIDTH):
        self.inner, self._ranking, self.budget, self.width = inner, ranking, budget, width
        self.trades, self.spent = 0, 0
        #: the size of the inner search's answer, once it is done (None before)
        self.started: Optional[int] = None
        self._answer: Optional[FrozenSet[T]] = None  # set once the inner search is done
        self._rank: Dict[T, int] = {}
        #: tests still to make: ("drop", (e,)) or ("trade", (a, b, c)), against the answer as it is then
        self._queue: List[Tuple[str, Tuple[T, ...]]] = []
        self._round: List[Tuple[str, Tuple[T, ...]]] = []
        self.done = False

    # -- the inner search's attributes the mode reads ------------------------------------------

    @property
    def required(self) -> List[T]:
        """The inner search's needed elements, then, once trading, the answer's."""
        if self._answer is None:
            return self.inner.required
        return sorted(self._answer, key=lambda e: self._rank.get(e, 0))

    @property
    def rounds(self) -> int:
        """The inner search's rounds plus the trades made."""
        return self.inner.rounds + self.trades

    @property
    def result(self) -> FrozenSet[T]:
        """The answer: the inner search's until a trade gives a smaller one."""
        if self._answer is None:
            return self.inner.result
        return self._answer

    def remaining(self) -> int:
        """The inner search's estimate, then the tests queued within the budget."""
        if self._answer is None:
            return self.inner.remaining() + (1 if self.budget else 0)
        return 0 if self.done else max(1, min(len(self._queue), self.budget - self.spent))

    def label(self, noun: str = "element", position: int = 0) -> str:
        """What the ``position``-th set of the last round is, for the log."""
        if self._answer is None:
            return self.inner.label(noun, position)
        kind = self._round[position][0] if position < len(self._round) else "trade"
        if kind == "drop":
            return f"the answer of {len(self._answer)} {noun}s without one"
        return f"two of the answer's {len(self._answer)} {noun}s traded for one outside it"

    # -- rounds ---------------------------------------------------------------------------------

    def _start(self) -> None:
        """The inner search is done: rank every element and queue the first trades."""
        self._answer = frozenset(self.inner.result)
        self.started = len(self._answer)
        self._rank = {e: i for i, e in enumerate(self._ranking())}
        self._queue = self._trades()

    def _least_first(self) -> List[T]:
        """The answer's elements, the least likely needed (last in the ranking) first."""
        assert self._answer is not None
        last = len(self._rank)
        return sorted(self._answer, key=lambda e: self._rank.get(e, last), reverse=True)

    def _trades(self) -> List[Tuple[str, Tuple[T, ...]]]:
        """``(a, b, c)`` for every pair of the answer, least likely needed first, and c among the first
        ``width`` elements outside it, most likely needed first."""
        assert self._answer is not None
        last = len(self._rank)
        outside = [e for e in sorted(self._rank, key=self._rank.__getitem__) if e not in self._answer][: self.width]
        pairs = sorted(
            itertools.combinations(self._least_first(), 2),
            key=lambda p: -(self._rank.get(p[0], last) + self._rank.get(p[1], last)),
        )
        return [("trade", (a, b, c)) for a, b in pairs for c in outside]

    def _set(self, item: Tuple[str, Tuple[T, ...]]) -> FrozenSet[T]:
        """The set ``item`` tests against the current answer."""
        assert self._answer is not None
        kind, elements = item
        if kind == "drop":
            return self._answer - {elements[0]}
        a, b, c = elements
        return (self._answer - {a, b}) | {c}

    def _propose(self, k: int) -> List[FrozenSet[T]]:
        self._round = []
        if self.done:
            return []
        if self._answer is None:
            sets = self.inner.propose(k)
            if sets or self.budget <= 0:
                self.done = not sets
                return sets
            self._start()
        left = self.budget - self.spent
        if left <= 0 or not self._queue:
            self.done = True
            return []
        self._round = self._queue[: min(k, left)]
        return [self._set(item) for item in self._round]

    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round in order; the first hit is taken (a serial run's choice),
        and the tests after it are made again against the new answer."""
        if self._answer is None:
            self.inner.step_round(hits)
            return
        self.spent += sum(hit is not None for hit in hits[: len(self._round)])  # every check made costs budget
        for item, hit in zip(self._round, hits):
            if hit is None:
                break
            self._queue.remove(item)
            if not hit:
                continue
            self._answer = self._set(item)
            if item[0] == "trade":
                self.trades += 1
                # the empty set never gives the target (the search's premise): a one-element answer is 1-minimal
                self._queue = [("drop", (e,)) for e in self._least_first()] if len(self._answer) > 1 else []
            else:
                self._queue = [q for q in self._queue if q[0] == "drop" and q[1][0] in self._answer]
            break
        if not self._queue and self._round and self._round[0][0] == "drop":
            self._queue = self._trades()  # the answer is 1-minimal again: trade on it

    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """The inner search's ``settled`` while it runs; then a hit with every test before it known."""
        if self._answer is None:
            return self.inner.settled(hits)
        return known_before(hits, True)
