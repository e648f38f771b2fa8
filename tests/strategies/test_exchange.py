"""The exchange after a 1-minimal answer (``strategies.precision.exchange``): two kept elements traded for one."""

from __future__ import annotations

from typing import Callable, FrozenSet

import pytest

from strategies.minimal import MinimalMarker
from strategies.precision.exchange import ExchangeSearch
from strategies.precision.group_search import GroupSearch


def drive(search, target: Callable[[FrozenSet[str]], bool], k: int = 1) -> FrozenSet[str]:
    """Run ``search`` to its end with rounds of ``k``; the tests it made go to ``search.tested``."""
    search.tested = []
    while sets := search.propose(k):
        search.tested += sets
        search.step_round([target(s) for s in sets])
    return search.result


def exchange(order, target, budget, k=1):
    inner = GroupSearch(order, MinimalMarker)
    search = ExchangeSearch(inner, lambda: inner.order, budget)
    return search, drive(search, target, k)


#: the ranking puts a and b first; c alone also gives the target, and so does {a, b}
def two_or_one(s: FrozenSet[str]) -> bool:
    return {"a", "b"} <= s or "c" in s


ORDER = ["a", "b", "c", "d", "e", "f"]


@pytest.mark.parametrize("k", [1, 3])
def test_a_pair_of_the_1_minimal_answer_is_traded_for_one_element(k):
    inner = GroupSearch(ORDER, MinimalMarker)
    assert drive(inner, two_or_one, k) == {"a", "b"}  # 1-minimal, not minimum
    search, answer = exchange(ORDER, two_or_one, budget=10, k=k)
    assert answer == {"c"} and search.trades == 1 and search.rounds == 3
    # a round of k trades costs k checks, the first hit taken; the empty set is known to miss, never tested
    assert search.spent == k and frozenset() not in search.tested


def test_no_budget_is_the_inner_search_and_a_spent_budget_stops_it():
    assert exchange(ORDER, two_or_one, budget=0)[1] == {"a", "b"}
    # the trade's only candidate set is {c} (the pair a, b traded for c): one check finds it
    search, answer = exchange(ORDER, two_or_one, budget=1)
    assert answer == {"c"} and search.spent == 1


def test_a_trade_that_leaves_a_droppable_element_is_made_1_minimal_again():
    """{a, b, c} is 1-minimal; {d, c} gives the target too once a and b go, and so does {d} alone."""

    def target(s):
        return {"a", "b", "c"} <= s or "d" in s

    order = ["a", "b", "c", "d", "e"]
    search, answer = exchange(order, target, budget=50)
    assert answer == {"d"} and search.trades == 1
    assert all(len(s) <= 3 for s in search.tested[-4:])


def test_nothing_to_trade_keeps_the_answer_and_every_answer_was_tested():
    def target(s):
        return {"a", "b", "c"} <= s

    search, answer = exchange(ORDER, target, budget=100)
    assert answer == {"a", "b", "c"} and search.trades == 0
    assert search.spent == 3 * 3  # 3 pairs x 3 elements outside (d, e, f), every trade failing
