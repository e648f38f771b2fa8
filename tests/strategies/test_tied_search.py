"""The tied search (precision's minimal marker over repeated blocks) on planted monotone targets: a position
needed in every block costs what one needed node costs, a fault in one block is found node by node, and every
answer is 1-minimal over the units it reports."""

from __future__ import annotations

import math
import random
from typing import FrozenSet, List, Set, Tuple

import pytest

from strategies.minimal import MinimalMarker
from strategies.precision.group_search import GroupSearch
from strategies.precision.tied_search import TiedSearch, Untie

BLOCKS, POSITIONS, OUTSIDE = 12, 20, 6


def grid(
    blocks: int = BLOCKS, positions: int = POSITIONS, outside: int = OUTSIDE
) -> Tuple[List[Tuple[str, List[int]]], int]:
    """Ties over a model of ``outside`` nodes, then ``blocks`` blocks of ``positions`` nodes each, numbered
    in topological order: (the ties, the node count). Node of position p in block b: outside + b * positions + p."""
    ties = [(f"layers.*.p{p}", [outside + b * positions + p for b in range(blocks)]) for p in range(positions)]
    return ties, outside + blocks * positions


def cell(block: int, position: int) -> int:
    return OUTSIDE + block * POSITIONS + position


def drive(search, needed: Set[int], k: int = 1) -> Tuple[FrozenSet[int], int]:
    """Run ``search`` against the monotone target "holds every needed node", ``k`` sets a round."""
    tests = 0
    while sets := search.propose(k):
        tests += len(sets)
        search.step_round([needed <= s for s in sets])
    return search.result, tests


def test_a_position_needed_in_every_block_costs_what_one_needed_node_costs():
    """Attention in every layer: the answer is its positions in every block, in a handful of checks that do
    not grow with the block count (a node-level group search pays per block)."""
    costs = {}
    for blocks in (4, 12, 24):
        ties, n = grid(blocks)
        needed = {OUTSIDE + b * POSITIONS + p for b in range(blocks) for p in (3, 4, 5)}
        order = sorted(range(n), key=lambda i: (i not in needed, i))
        search = TiedSearch(order, ties, MinimalMarker)
        result, tests = drive(search, needed)
        assert result == frozenset(needed)
        assert search.level == "block positions" and all(unit for _, _, unit in search.kept)
        costs[blocks] = tests
        node_level = drive(GroupSearch(order, MinimalMarker), needed)[1]
        assert blocks == 4 or tests < node_level / 2
    assert costs[4] == costs[12] == costs[24] <= 3 * 2 + 2 * math.ceil(math.log2(POSITIONS + OUTSIDE)) + 3


def test_a_fault_in_one_block_is_found_node_by_node():
    """An overflow in one layer's norm (BERT's planted layer 1): the tie is untied to that block's node."""
    ties, n = grid()
    needed = {cell(1, 7), cell(1, 8)}
    order = list(range(n))
    search = TiedSearch(order, ties, MinimalMarker)
    result, tests = drive(search, needed)
    assert result == frozenset(needed)
    assert search.level == "nodes"
    assert tests <= 30


@pytest.mark.parametrize("seed", range(25))
def test_untie_nodes_gives_the_needed_set_exactly(seed):
    """``untie=nodes``: 1-minimal at node level, which under a monotone target is the needed set itself."""
    rng = random.Random(seed)
    ties, n = grid()
    needed = set(rng.sample(range(n), rng.randint(1, 15)))
    order = list(range(n))
    rng.shuffle(order)
    result, _ = drive(TiedSearch(order, ties, MinimalMarker, untie=Untie.nodes), needed)
    assert result == frozenset(needed)


@pytest.mark.parametrize("untie", [Untie.auto, Untie.none])
@pytest.mark.parametrize("seed", range(25))
def test_every_unit_of_the_answer_is_needed(untie, seed):
    """1-minimal over the units reported: each kept tie or tie part holds a needed node (dropping it fails),
    and each node kept outside them is needed."""
    rng = random.Random(seed)
    ties, n = grid()
    rows = rng.sample(range(POSITIONS), rng.randint(0, 3))
    needed = {cell(b, p) for p in rows for b in range(BLOCKS)}
    needed |= set(rng.sample(range(n), rng.randint(1, 8)))
    order = list(range(n))
    rng.shuffle(order)
    search = TiedSearch(order, ties, MinimalMarker, untie=untie)
    result, _ = drive(search, needed)
    assert needed <= result
    units = [nodes for _, nodes, _ in search.kept]
    in_units = frozenset().union(*units) if units else frozenset()
    assert all(nodes & needed for nodes in units)
    assert result - in_units <= needed
    if untie is Untie.none:
        assert all(unit for _, _, unit in search.kept)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_rounds_of_several_give_the_serial_answer(k):
    ties, n = grid()
    rng = random.Random(k)
    needed = {cell(b, 2) for b in range(BLOCKS)} | {cell(0, 9), 1}
    order = list(range(n))
    rng.shuffle(order)
    serial, _ = drive(TiedSearch(order, ties, MinimalMarker), needed)
    parallel, _ = drive(TiedSearch(order, ties, MinimalMarker), needed, k)
    assert parallel == serial


def test_ahead_never_changes_the_search():
    """The look-ahead's copies step on their own: the search goes on as if it had not been asked."""
    ties, n = grid()
    needed = {cell(b, 2) for b in range(BLOCKS)}
    search = TiedSearch(list(range(n)), ties, MinimalMarker)
    tests = 0
    while sets := search.propose(2):
        search.ahead(sets, 2)
        tests += len(sets)
        search.step_round([needed <= s for s in sets])
    assert search.result == frozenset(needed)


def test_the_units_are_ranked_again_once_when_many_fail():
    """A reorder gets each unit as its node set (a tie: every block's node) and is called once."""
    ties, n = grid(blocks=4, positions=60)
    needed = {OUTSIDE + b * 60 + p for b in range(4) for p in range(40, 60)}
    calls: List[int] = []

    def reorder(units: List[FrozenSet[int]]) -> List[FrozenSet[int]]:
        calls.append(len(units))
        assert all(isinstance(u, frozenset) for u in units)
        return sorted(units, key=lambda u: (not (u & needed), min(u)))

    result, _ = drive(TiedSearch(list(range(n)), ties, MinimalMarker, reorder), needed)
    assert needed <= result and calls == [60 + OUTSIDE]


@pytest.mark.parametrize("first", [3, 5])
def test_positions_needing_the_same_blocks_learn_them_from_the_ties_before(first):
    """Errors the blocks amplify: many positions need fp32 in the same first blocks. Once a tie kept those,
    the next one tries them first (a pass and one failing trim): about 3.5 checks a position where the
    halves and a group search over blocks took 7.5; each answer exact."""
    ties, n = grid()
    costs = {}
    for positions in (4, 8):
        needed = {cell(b, p) for p in range(positions) for b in range(first)}
        order = sorted(range(n), key=lambda i: (i not in needed, i))
        search = TiedSearch(order, ties, MinimalMarker)
        result, costs[positions] = drive(search, needed)
        assert result == frozenset(needed)
        assert [len(nodes) for _, nodes, _ in search.kept] == [first] * positions
    assert (costs[8] - costs[4]) / 4 <= 4, costs


@pytest.mark.parametrize("rows", [[3, 4, 5], [1, 7, 9, 11, 13]])
def test_a_position_the_ranking_sees_needed_alike_in_every_block_costs_one_check(rows):
    """Attention overflowing in every layer: the ranking puts each position's nodes of every block one after
    another (in no block order). Untying costs one check a position (its lower-ranked half dropped fails:
    the tie stays whole) and no joint probe; the tied phase before it is ``untie=none``'s."""
    ties, n = grid()
    rng = random.Random(len(rows))
    needed = {cell(b, p) for p in rows for b in range(BLOCKS)}
    order = []
    for p in rows:
        blocks = list(range(BLOCKS))
        rng.shuffle(blocks)
        order += [cell(b, p) for b in blocks]
    order += [i for i in range(n) if i not in needed]
    tied_only = drive(TiedSearch(order, ties, MinimalMarker, untie=Untie.none), needed)[1]
    search = TiedSearch(order, ties, MinimalMarker)
    result, tests = drive(search, needed)
    assert result == frozenset(needed) and all(unit for _, _, unit in search.kept)
    assert tests == tied_only + len(rows)
