"""The ranked search (precision's minimal marker) on planted monotone targets: exact answers, and the check
counts the issue sets (at most 3k + 2 ceil(log2 n) for k needed elements ranked first)."""

from __future__ import annotations

import math
import random

import pytest

from strategies.bisect import BisectMarker
from strategies.linear import LinearMarker
from strategies.minimal import MinimalMarker
from strategies.prefix_search import PrefixSearch
from strategies.ranked_search import RankedSearch
from strategies.set_search import SetSearch


def _drive(search, needed):
    """Run a search against the monotone target "holds every needed element"; return (result, tests)."""
    tests = 0
    while (c := search.next()) is not None:
        tests += 1
        search.step(needed <= c)
    return search.result, tests


@pytest.mark.parametrize("marker", [MinimalMarker, BisectMarker, LinearMarker])
@pytest.mark.parametrize("seed", range(20))
def test_the_answer_is_exactly_the_needed_set(marker, seed):
    """With a monotone target the 1-minimal answer is the needed set itself, however the ranking places it."""
    rng = random.Random(seed)
    n = rng.randint(1, 200)
    needed = set(rng.sample(range(n), rng.randint(1, min(n, 12))))
    order = list(range(n))
    rng.shuffle(order)
    result, _ = _drive(RankedSearch(order, marker), needed)
    assert result == frozenset(needed)


@pytest.mark.parametrize("n, k", [(185, 33), (369, 65), (330, 1), (330, 5), (1000, 300)])
def test_needed_elements_ranked_first_cost_about_one_check_each(n, k):
    needed = set(range(k))
    result, tests = _drive(RankedSearch(list(range(n)), MinimalMarker), needed)
    assert result == frozenset(needed)
    assert tests <= 3 * k + 2 * math.ceil(math.log2(n))
    _, set_tests = _drive(SetSearch(list(range(n)), MinimalMarker), needed)
    assert tests <= set_tests and (k < 10 or tests < set_tests / 3), "the set search pays a gallop per needed element"


def test_a_few_needed_elements_spread_through_the_ranking_cost_what_the_set_search_costs():
    order = list(range(330))
    needed = {0, 1, 11}
    _, ranked_tests = _drive(RankedSearch(order, MinimalMarker), needed)
    _, set_tests = _drive(SetSearch(order, MinimalMarker), needed)
    assert ranked_tests <= set_tests + 1


def test_a_ranked_prefix_costs_log2_n_checks():
    """direction=ranked: bisect over the ranking, within 2 ceil(log2 n) checks, answers the ranked prefix."""
    n, needed = 369, set(range(65))
    result, tests = _drive(PrefixSearch(list(range(n)), BisectMarker), needed)
    assert tests <= math.ceil(math.log2(n)) and result == frozenset(needed)


def test_non_monotone_target_still_returns_a_tested_hit():
    search = RankedSearch(list(range(10)), MinimalMarker)
    hits = []
    while (c := search.next()) is not None:
        hit = 3 in c and 9 not in c
        if hit:
            hits.append(c)
        search.step(hit)
    assert search.result in hits
