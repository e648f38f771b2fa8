"""Speculative rounds of the markers (groundwork for parallel checks, issue 13): ``propose(k)`` indices tested
at once give the serial answer, in fewer rounds."""

from __future__ import annotations

import math
import random

import pytest

from strategies.bisect import BisectMarker
from strategies.linear import LinearMarker
from strategies.minimal import MinimalMarker

MARKERS = [BisectMarker, LinearMarker, MinimalMarker]


def _serial(marker, hit):
    while (i := marker.next()) is not None:
        marker.step(i, hit(i))
    return marker.boundary


def _rounds(marker, hit, k):
    rounds = checks = 0
    while batch := marker.propose(k):
        assert len(batch) <= k and len(set(batch)) == len(batch)
        assert all(marker.lo < i < marker.hi for i in batch)
        rounds += 1
        checks += len(batch)
        marker.step_round([(i, hit(i)) for i in batch])
    return marker.boundary, rounds, checks


@pytest.mark.parametrize("cls", MARKERS)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("count, boundary", [(1, 1), (2, 1), (2, 2), (10, 7), (330, 1), (330, 330), (672, 300)])
def test_rounds_give_the_serial_boundary(cls, k, count, boundary):
    found, rounds, _ = _rounds(cls(count), lambda i: i >= boundary, k)
    assert found == _serial(cls(count), lambda i: i >= boundary) == boundary
    if cls is BisectMarker and count > 1:
        # a round holds the first floor(log2(k + 1)) levels of the serial search's decision tree
        assert rounds <= math.ceil(math.log2(count) / math.floor(math.log2(k + 1))) + 1


def test_bisect_with_three_workers_decides_two_serial_steps_a_round():
    serial = math.ceil(math.log2(672))
    for boundary in (1, 100, 300, 672):
        _, rounds, _ = _rounds(BisectMarker(672), lambda i, b=boundary: i >= b, 3)
        assert rounds <= math.ceil(serial / 2) < serial


def test_bisect_rounds_give_the_serial_answer_on_a_non_monotone_check():
    """A round's verdicts are taken along the serial search's path, so the boundary does not depend
    on the number of workers even when the check's verdicts are not monotone in the index."""
    for seed in range(50):
        rng = random.Random(seed)
        table = {i: rng.random() < 0.5 for i in range(1, 300)}
        table[300] = True
        serial = _serial(BisectMarker(300), table.__getitem__)
        for k in (2, 3, 4, 7, 16):
            found, _, _ = _rounds(BisectMarker(300), table.__getitem__, k)
            assert found == serial


def test_a_bisect_round_is_settled_once_the_serial_path_leaves_it():
    marker = BisectMarker(16)
    assert marker.propose(3) == [8, 4, 12]
    assert not marker.settled([(8, None), (4, True), (12, None)])
    assert marker.settled([(8, True), (4, None), (12, None)]) is False  # 4 is on the path
    assert marker.settled([(8, False), (4, None), (12, True)])  # 4 is off the path: moot
    marker.step_round([(8, False), (4, None), (12, True)])
    assert (marker.lo, marker.hi) == (8, 12)


def test_linear_rounds_give_the_serial_answer_on_a_non_monotone_check():
    """Linear relies on nothing beyond one step: verdicts below the first miss of a round are ignored."""
    for seed in range(50):
        rng = random.Random(seed)
        table = {i: rng.random() < 0.7 for i in range(1, 60)}
        serial = _serial(LinearMarker(60), table.__getitem__)
        for k in (2, 3, 8):
            found, _, _ = _rounds(LinearMarker(60), table.__getitem__, k)
            assert found == serial


def test_k_must_be_positive():
    for cls in MARKERS:
        with pytest.raises(ValueError):
            cls(10).propose(0)
