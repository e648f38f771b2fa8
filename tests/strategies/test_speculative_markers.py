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
        assert rounds <= math.ceil(math.log(count, k + 1)) + 1


def test_bisect_with_four_workers_needs_about_log5_rounds():
    _, rounds, _ = _rounds(BisectMarker(672), lambda i: i >= 300, 4)
    assert rounds <= 5 < math.ceil(math.log2(672))


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
