"""Rounds of the searches (issue 13): ``propose(k)`` sets checked at once, some cancelled once the round
is ``settled``, give the serial answer on planted faults, in fewer rounds."""

from __future__ import annotations

import copy
import random

import pytest

from strategies.bisect import BisectMarker
from strategies.linear import LinearMarker
from strategies.minimal import MinimalMarker
from strategies.precision.group_search import GroupSearch
from strategies.prefix_search import PrefixSearch
from strategies.set_search import SetSearch

MARKERS = [BisectMarker, LinearMarker, MinimalMarker]


def _serial(search, target):
    checks = 0
    while (s := search.next()) is not None:
        checks += 1
        search.step(target(s))
    return search.result, checks


def _parallel(search, target, k, rng):
    """Rounds whose verdicts arrive in a random order; once the round is settled the rest are cancelled (None)."""
    rounds = checks = 0
    while sets := search.propose(k):
        assert 1 <= len(sets) <= k and len(set(sets)) == len(sets)
        rounds += 1
        hits = [None] * len(sets)
        for position in rng.sample(range(len(sets)), len(sets)):
            if search.settled(hits):
                break
            hits[position] = target(sets[position])
            checks += 1
        search.step_round(hits)
    return search.result, rounds, checks


def _planted(rng, n, needed):
    planted = frozenset(rng.sample(range(n), needed))
    return planted, lambda s: planted <= s


@pytest.mark.parametrize("search", [SetSearch, PrefixSearch])
@pytest.mark.parametrize("marker", MARKERS)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_rounds_give_the_serial_answer_on_planted_faults(search, marker, k):
    """The set search finds the planted set itself; the prefix search the shortest prefix holding it."""
    for seed in range(12):
        rng = random.Random(seed)
        n = rng.choice([1, 5, 40, 330])
        planted, target = _planted(rng, n, rng.randint(1, min(n, 4)))
        serial, serial_checks = _serial(search(list(range(n)), marker), target)
        found, rounds, _ = _parallel(search(list(range(n)), marker), target, k, rng)
        assert found == serial
        assert search is PrefixSearch or found == planted
        assert rounds <= max(serial_checks, 1)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_ranked_search_rounds_find_the_planted_set(k):
    """Dense rounds (needed elements ranked together) and sparse ones (spread out) alike."""
    for seed in range(20):
        rng = random.Random(seed)
        n = rng.choice([8, 60, 185])
        needed = rng.randint(1, min(n, 12))
        if seed % 2:
            planted = frozenset(range(needed))  # a ranking that puts the needed first: dense rounds
            target = lambda s, p=planted: p <= s  # noqa: E731
        else:
            planted, target = _planted(rng, n, needed)
        serial, _ = _serial(GroupSearch(list(range(n)), MinimalMarker), target)
        found, _, _ = _parallel(GroupSearch(list(range(n)), MinimalMarker), target, k, rng)
        assert found == serial == planted


def test_the_set_search_checks_the_splits_of_a_round_together():
    """One needed node among 672: 10 serial checks; with 4 workers, 6 rounds or fewer (5.4 on
    average over the node's position; the probe of R alone shares a round with the next round's
    splits)."""
    target = lambda s: 300 in s  # noqa: E731
    _, serial_checks = _serial(SetSearch(range(672), BisectMarker), target)
    found, rounds, _ = _parallel(SetSearch(range(672), BisectMarker), target, 4, random.Random(0))
    assert found == {300}
    assert serial_checks == 10 and rounds <= 6


def test_linear_rounds_cancel_the_checks_below_the_first_miss():
    search = PrefixSearch(list(range(20)), LinearMarker)
    sets = search.propose(4)
    assert [len(s) for s in sets] == [19, 18, 17, 16]
    assert not search.settled([True, None, None, None])
    assert search.settled([True, False, None, None])  # 17 and 16 cannot change the answer
    search.step_round([True, False, None, None])
    assert search.result == frozenset(range(19))
    assert search.propose(4) == []


def test_k_must_be_positive():
    for search in (SetSearch(range(4), BisectMarker), GroupSearch(list(range(4)), MinimalMarker)):
        with pytest.raises(ValueError):
            search.propose(0)


@pytest.mark.parametrize("search", [SetSearch, PrefixSearch])
@pytest.mark.parametrize("marker", MARKERS)
@pytest.mark.parametrize("k", [1, 2, 4])
def test_ahead_holds_the_round_that_follows_and_leaves_the_search_as_it_was(search, marker, k):
    """Under a monotone target, the round after each round is one of ``ahead``'s rounds; asking does
    not change the search (its answer and rounds are the ones it gives without asking)."""
    for seed in range(8):
        rng = random.Random(seed)
        n = rng.choice([5, 40, 330])
        _, target = _planted(rng, n, rng.randint(1, 3))
        plain = search(list(range(n)), marker)
        asked = search(list(range(n)), marker)
        while sets := asked.propose(k):
            assert plain.propose(k) == sets
            rounds = asked.ahead(sets, k)
            assert len(rounds) == len(sets) + 1
            hits = [target(s) for s in sets]
            asked.step_round(hits)
            plain.step_round(hits)
            assert copy.deepcopy(asked).propose(k) in rounds
        assert asked.result == plain.result
