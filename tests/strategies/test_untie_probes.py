"""The probes the tied search tries first when it unties a tie (``strategies.precision.untie_probes``)."""

from __future__ import annotations

from strategies.precision.untie_probes import alike, first_probes, trimmed, usual_blocks

# a tie of 6 blocks: node 10 + 100 b in block b
TIE = [10 + 100 * b for b in range(6)]


def test_a_tie_ranked_together_is_needed_alike_and_gets_one_probe():
    together = {n: r for r, n in enumerate(reversed(TIE))}  # ranks 0..5, last block first
    probes = first_probes(sorted(TIE, key=together.get), together, learned=[frozenset({0, 1})])
    assert alike(TIE, together) and len(probes) == 1
    assert probes[0].dropped == frozenset(TIE[:3]), "its lower-ranked half: the first blocks rank last here"


def test_a_spread_tie_tries_the_blocks_the_ties_before_kept_then_the_halves():
    spread = {n: 40 * i for i, n in enumerate(TIE)}  # other positions' nodes among them
    ranked = sorted(TIE, key=spread.get)
    assert not alike(TIE, spread)
    learned = [frozenset({0, 1}), frozenset({0, 1, 2}), frozenset({0, 1})]
    probes = first_probes(ranked, spread, learned)
    assert probes[0].label == "in the 2 of 6 blocks the ties before it kept most often"
    assert probes[0].rest == TIE[:2] and probes[0].trims and probes[0].dropped == frozenset(TIE[2:])
    assert len(probes) == 2, "ranked in block order, the two halves drop the same blocks: one of them"
    assert trimmed(probes[0]).dropped == frozenset({TIE[1]}) and trimmed(probes[0]).rest == [TIE[0]]


def test_the_usual_blocks_are_the_most_often_kept_the_latest_of_equals_and_must_fit():
    assert usual_blocks([], 6) is None
    assert usual_blocks([frozenset({0}), frozenset({1})], 6) == frozenset({1})
    assert usual_blocks([frozenset({0}), frozenset({1}), frozenset({0})], 6) == frozenset({0})
    assert usual_blocks([frozenset({7})], 6) is None, "a set from a tie of more blocks does not fit"
