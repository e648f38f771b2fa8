"""Markers and the set search: pure objects, tested on predicates with known answers."""

from __future__ import annotations

import math

import pytest

from strategies.bisect import BisectMarker
from strategies.linear import LinearMarker
from strategies.minimal import MinimalMarker
from strategies.set_search import SetSearch

MARKERS = [BisectMarker, LinearMarker, MinimalMarker]


def _boundary(marker, boundary):
    tests = 0
    while (i := marker.next()) is not None:
        tests += 1
        marker.step(i, i >= boundary)
    return marker.boundary, tests


@pytest.mark.parametrize("cls", MARKERS)
@pytest.mark.parametrize("count, boundary", [(1, 1), (2, 1), (2, 2), (10, 7), (672, 1), (672, 672), (672, 300)])
def test_markers_find_the_boundary(cls, count, boundary):
    found, tests = _boundary(cls(count), boundary)
    assert found == boundary
    if cls is BisectMarker:
        assert tests <= math.ceil(math.log2(count)) if count > 1 else tests == 0
    if cls is LinearMarker:
        assert tests == count - boundary + (1 if boundary > 1 else 0)


def test_minimal_gallops_to_an_early_boundary():
    _, tests = _boundary(MinimalMarker(1000), 3)
    assert tests <= 4
    _, bisect_tests = _boundary(BisectMarker(1000), 3)
    assert tests < bisect_tests


def test_markers_reject_empty_ranges():
    for cls in MARKERS:
        with pytest.raises(ValueError):
            cls(0)


def _search(cls, n, needed, order=None):
    s = SetSearch(order or list(range(n)), cls)
    tests = 0
    while (c := s.next()) is not None:
        tests += 1
        s.step(needed <= c)
    return s.result, tests


@pytest.mark.parametrize("cls", MARKERS)
@pytest.mark.parametrize("needed", [{0}, {329}, {224}, {10, 200}, {5, 6, 7, 300}])
def test_set_search_finds_exactly_the_needed_set(cls, needed):
    result, _tests = _search(cls, 330, needed)
    assert result == frozenset(needed)


def test_bisect_set_search_cost_single_fault():
    # ceil(log2 330) boundary tests + 1 probe
    _, tests = _search(BisectMarker, 330, {224})
    assert tests <= math.ceil(math.log2(330)) + 1


def test_ranking_helps_the_minimal_marker():
    needed = {290, 310}
    ranked = [290, 310] + [i for i in range(330) if i not in needed]
    _, ranked_tests = _search(MinimalMarker, 330, needed, ranked)
    _, plain_tests = _search(MinimalMarker, 330, needed)
    assert ranked_tests < plain_tests


def test_non_monotone_target_still_returns_a_tested_hit():
    # target holds only for sets containing 3 and *not* containing 9: not monotone
    s = SetSearch(list(range(10)), BisectMarker)
    hits = []
    while (c := s.next()) is not None:
        hit = 3 in c and 9 not in c
        if hit:
            hits.append(c)
        s.step(hit)
    assert s.result in hits
