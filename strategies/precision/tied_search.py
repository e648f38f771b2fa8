"""Tied search: a 1-minimal kept set over a model's repeated blocks, deciding each block position once.

Pure: no I/O, no ONNX, no logging. Used by ``mode=precision marker=minimal`` where the model repeats
a block (``runner.graph.blocks``: the layers of a transformer). When every block needs the same fix
(attention logits past fp16's range in every layer), a node-level search pays for the same finding
once per block; this one pays once per position.

Two phases, over a monotone target that holds for every element and not for none:

1. **Tied**: the units are the ties (one block position in every block that holds it: "the score
   MatMul of every layer") and the nodes in no tie. A ``GroupSearch`` over the units, ranked by
   their best-ranked node, finds a set of units that is 1-minimal: dropping any kept unit, a tie
   from every block at once, fails. Cost: the group search's over u units instead of n nodes,
   about 2 log2(b) + k log2(u/k) + O(k) tests for k needed units.
2. **Untie** each kept tie where it pays (``untie``):
   - ``auto``: one probe keeps every kept tie in its top-ranked block only (unless each looks needed
     alike in every block). A pass (a fault in one block each) ends the search: each tie is one node,
     needed alone. Where it fails, each tie gets the probes ``strategies.precision.untie_probes``
     chooses from what is known (one for a tie the ranking sees needed alike in every block; the
     blocks the ties before it kept; the lower-ranked, then the later half of its blocks). All failing
     leave the tie whole (a position needed in most blocks: deciding each block would cost a test a
     block). A half's pass drops that half, and a group search over the other half, in the probe's
     order, finds the blocks that need it (``GroupSearch``) until its first failing removal, which
     leaves the blocks still undecided with the needed ones as one unit; the usual blocks' pass trims
     from the lowest-ranked block left while that passes. One test when each tie is needed in one
     block; one for a tie needed alike in every block, two for another that stays whole, two for a tie
     that needs the blocks the ties before it kept, and about 2 + 2 log2(b) for a tie needed in one
     block the ranking puts b-th.
   - ``nodes``: a group search over each kept tie's nodes (``GroupSearch``): 1-minimal at node level,
     at about one test per kept node of a tie needed in most blocks.
   - ``none``: the tied answer as it is.

Every unit left is needed as a whole: a tie, or the part of one a gallop kept, was shown needed with
more kept than the answer holds, so (monotone target) the answer without it fails too. The answer is
1-minimal over its final units: the ties and tie parts kept as units, and single nodes (``level``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from runner.config import Untie  # the searches name it here
from strategies.boundary import BoundaryMarker
from strategies.precision.group_search import GroupSearch
from strategies.precision.untie_probes import Probe, alike, first_probes, trimmed
from strategies.search_rounds import RoundSearch


class _Fixed:
    """What the copies ``ahead`` makes share instead of copying: the units, their labels, the reorder."""

    def __init__(
        self,
        members: List[FrozenSet[int]],
        labels: List[str],
        ranks: Dict[int, int],
        reorder: Optional[Callable[[List[Any]], List[Any]]],
    ):
        self.members, self.labels, self.ranks, self.reorder = members, labels, ranks, reorder

    def __deepcopy__(self, memo: Dict[int, Any]) -> _Fixed:
        return self


class TiedSearch(RoundSearch[int]):
    """Search the ties and untied nodes as units, then untie the kept ties where it pays.

    Args:
        order: the node ranking, most likely needed first (every searched node once).
        ties: the ties, each a sequence of node indices (one per block) with its label; nodes not in
            ``order`` are left out, and a tie left with fewer than two nodes is no tie.
        marker_factory: the gallop's boundary marker (minimal), as for ``GroupSearch``.
        reorder: ranks units again when a long ranked prefix fails (``GroupSearch``'s ``reorder``);
            it gets and returns a list of node sets, most likely needed first. None: never.
        untie: how far the tied answer is untied (``Untie``).

    Attributes:
        kept: the kept ties decided so far: (label, nodes kept, whether they are one unit of the answer
            rather than shown needed node by node).

    Usage: as every ``RoundSearch``; the caller must know that the whole ``order`` gives the target and
    the empty set does not.
    """

    def __init__(
        self,
        order: Sequence[int],
        ties: Sequence[Tuple[str, Sequence[int]]],
        marker_factory: Callable[[int], BoundaryMarker],
        reorder: Optional[Callable[[List[FrozenSet[int]]], List[FrozenSet[int]]]] = None,
        untie: Untie = Untie.auto,
    ):
        ranks = {node: r for r, node in enumerate(order)}
        members: List[FrozenSet[int]] = []
        labels: List[str] = []
        tied: Set[int] = set()
        for label, nodes in ties:
            searched = frozenset(i for i in nodes if i in ranks)
            if len(searched) >= 2:
                members.append(searched)
                labels.append(label)
                tied |= searched
        for node in order:
            if node not in tied:
                members.append(frozenset([node]))
                labels.append("")
        ids = sorted(range(len(members)), key=lambda u: min(ranks[i] for i in members[u]))
        self._fixed = _Fixed(members, labels, ranks, reorder)
        self.untie = untie
        self._marker_factory = marker_factory
        self._tied: Optional[GroupSearch[int]] = GroupSearch(ids, marker_factory, self._reorder if reorder else None)
        self._answer: FrozenSet[int] = frozenset()  # nodes, once the tied phase is over
        self._pending: List[int] = []  # kept ties still to untie
        self._current: Optional[int] = None  # the tie being untied
        #: the probes of the tie being untied still to run, the running one first (``untie_probes.Probe``)
        self._probes: List[Probe] = []
        #: the blocks each tie decided so far kept, where it kept some but not all (block indices)
        self._learned: List[FrozenSet[int]] = []
        self._joint: Optional[FrozenSet[int]] = None  # what the joint probe drops, while it runs
        self._blocks: Optional[GroupSearch[int]] = None  # its search over blocks
        self._round_kind = ""
        self.kept: List[Tuple[str, FrozenSet[int], bool]] = []
        self.done = False

    # -- units ------------------------------------------------------------------------------

    def _nodes(self, units: FrozenSet[int]) -> FrozenSet[int]:
        return frozenset().union(*(self._fixed.members[u] for u in units)) if units else frozenset()

    def _reorder(self, units: List[int]) -> List[int]:
        """The caller's reorder over the units' node sets, mapped back to unit ids."""
        assert self._fixed.reorder is not None
        by_nodes = {self._fixed.members[u]: u for u in units}
        ranked = self._fixed.reorder([self._fixed.members[u] for u in units])
        return [by_nodes[frozenset(nodes)] for nodes in ranked]

    @property
    def units(self) -> int:
        """How many units the tied phase searches (ties and untied nodes)."""
        return len(self._fixed.members)

    # -- rounds -----------------------------------------------------------------------------

    def _propose(self, k: int) -> List[FrozenSet[int]]:
        if self._tied is not None:
            sets = self._tied.propose(k)
            if sets:
                self._round_kind = "tied"
                return [self._nodes(s) for s in sets]
            self._end_tied()
        if self._joint is not None:
            self._round_kind = "joint"
            return [self._answer - self._joint]
        while self._current is not None or self._next_tie():
            if self._probe is not None:
                self._round_kind = "probe"
                return [self._answer - self._probe]
            assert self._blocks is not None
            sets = self._blocks.propose(k)
            if sets:
                self._round_kind = "blocks"
                rest = self._answer - self._tie_nodes()
                return [rest | s for s in sets]
            self._end_tie(self._blocks.result, True)
        self.done = True
        return []

    def _end_tied(self) -> None:
        assert self._tied is not None
        kept = self._tied.result
        self._answer = self._nodes(kept)
        self._tied = None
        ties = [u for u in kept if self._fixed.labels[u]]
        if self.untie is Untie.none:
            self.kept = [(self._fixed.labels[u], self._fixed.members[u], True) for u in sorted(ties)]
            return
        # least likely needed first: a sparse tie is likeliest there
        self._pending = sorted(ties, key=lambda u: -min(self._fixed.ranks[i] for i in self._fixed.members[u]))
        # first guess each tie is needed in its top-ranked block only, unless every one looks needed alike in all
        if self.untie is Untie.auto and not all(alike(self._fixed.members[u], self._fixed.ranks) for u in ties):
            self._joint = frozenset(i for u in ties for i in self._ranked(self._fixed.members[u])[1:])

    @property
    def _probe(self) -> Optional[FrozenSet[int]]:
        """What the running probe drops, while one runs."""
        return self._probes[0].dropped if self._probes else None

    def _tie_nodes(self) -> FrozenSet[int]:
        assert self._current is not None
        return self._fixed.members[self._current]

    def _ranked(self, nodes: FrozenSet[int]) -> List[int]:
        """``nodes`` in the ranking's order, most likely needed first."""
        return sorted(nodes, key=lambda i: self._fixed.ranks[i])

    def _next_tie(self) -> bool:
        if not self._pending:
            return False
        self._current = self._pending.pop(0)
        ranked = self._ranked(self._tie_nodes())
        if self.untie is Untie.auto:
            self._probes = first_probes(ranked, self._fixed.ranks, self._learned)
        else:
            self._blocks = GroupSearch(ranked, self._marker_factory)
        return True

    def _end_tie(self, kept: FrozenSet[int], by_node: bool) -> None:
        """The current tie keeps ``kept``: shown needed node by node, or (``by_node`` False) as one unit."""
        assert self._current is not None
        label, whole = self._fixed.labels[self._current], self._tie_nodes()
        if kept and len(kept) < len(whole):
            in_blocks = sorted(whole)
            self._learned.append(frozenset(in_blocks.index(n) for n in kept))
        self._answer = (self._answer - whole) | kept
        self.kept.append((label, kept, not (by_node or len(kept) == 1)))
        self._current, self._probes, self._blocks = None, [], None

    def step_round(self, hits: Sequence[Optional[bool]]) -> None:
        """Feed the verdicts of the last round, in order (None: not checked): True when a set gave the target."""
        if self._round_kind == "tied":
            assert self._tied is not None
            self._tied.step_round(hits)
        elif self._round_kind == "joint":
            if not hits or hits[0] is None:
                return
            if hits[0]:  # each kept tie is needed, and now only its top-ranked node is left: needed alone
                for u in self._pending:
                    label, top = self._fixed.labels[u], frozenset(self._ranked(self._fixed.members[u])[:1])
                    self.kept.append((label, top, False))
                self._answer -= self._joint or frozenset()
                self._pending = []
            self._joint = None
        elif self._round_kind == "probe":
            if not hits or hits[0] is None:
                return
            probe = self._probes.pop(0)
            if hits[0]:
                self._answer -= probe.dropped
                self._probes = []
                if probe.trims and len(probe.rest) >= 2:  # drop the lowest-ranked block left, while that passes
                    self._probes = [trimmed(probe)]
                elif probe.trims:
                    self._end_tie(frozenset(probe.rest), False)
                else:
                    self._blocks = GroupSearch(probe.rest, self._marker_factory)
            elif not self._probes:
                # the tie as the passing probes left it: whole, unless a trim dropped some of its blocks
                self._end_tie(self._answer & self._tie_nodes(), False)
        elif self._round_kind == "blocks":
            assert isinstance(self._blocks, GroupSearch)
            removing = self._blocks.removing
            self._blocks.step_round(hits)
            if self.untie is Untie.auto and removing and False in hits:  # it stops paying: the rest is one unit
                self._end_tie(self._blocks.result, False)

    def settled(self, hits: Sequence[Optional[bool]]) -> bool:
        """True when the verdicts known so far (None: running) decide the round."""
        if self._round_kind == "tied" and self._tied is not None:
            return self._tied.settled(hits)
        if self._round_kind == "blocks" and self._blocks is not None:
            return self._blocks.settled(hits)
        return bool(hits) and hits[0] is not None

    def ahead(self, sets: Sequence[FrozenSet[int]], k: int) -> List[List[FrozenSet[int]]]:
        """``RoundSearch.ahead``, with the inner group search's copies never calling ``reorder``."""
        if self._tied is not None:
            self._tied._forking = True
        try:
            return super().ahead(sets, k)
        finally:
            if self._tied is not None:
                self._tied._forking = False

    def __deepcopy__(self, memo: Dict[int, Any]) -> TiedSearch:
        fork = copy.copy(self)
        for name in ("_tied", "_blocks"):
            setattr(fork, name, copy.deepcopy(getattr(self, name), memo))
        fork._pending, fork.kept, fork._probes = list(self._pending), list(self.kept), list(self._probes)
        fork._learned = list(self._learned)
        return fork

    # -- what it found --------------------------------------------------------------------

    @property
    def result(self) -> FrozenSet[int]:
        """The kept nodes so far (tested together and giving the target); once ``done``, the answer."""
        if self._tied is not None:
            return self._nodes(self._tied.result)
        if self._blocks is not None:
            return (self._answer - self._tie_nodes()) | self._blocks.result
        return self._answer

    @property
    def required(self) -> List[int]:
        """Nodes shown needed so far."""
        if self._tied is not None:
            return sorted(self._nodes(frozenset(self._tied.required)))
        return sorted(self._answer)

    @property
    def rounds(self) -> int:
        """Needed units found so far."""
        return self._tied.rounds if self._tied is not None else len(self.kept)

    @property
    def level(self) -> str:
        """What the answer is 1-minimal over: ``"nodes"`` when every kept tie was decided node by node,
        else ``"block positions"`` (ties or tie parts kept as units, single nodes elsewhere)."""
        return "block positions" if any(unit and len(nodes) > 1 for _, nodes, unit in self.kept) else "nodes"

    def remaining(self) -> int:
        """Tests left, estimated: the tied phase's, then a probe per kept tie; a block search's."""
        if self.done:
            return 0
        if self._tied is not None:
            return self._tied.remaining() + 1
        if self._blocks is not None:
            return self._blocks.remaining() + len(self._pending)
        return 1 + len(self._pending)

    def label(self, noun: str = "element", position: int = 0) -> str:
        """What the ``position``-th set of the last round is, for the log."""
        if self._round_kind == "tied" and self._tied is not None:
            return self._tied.label("unit", position) + " (block positions tied)"
        if self._round_kind == "joint" and self._joint is not None:
            return f"each of the {len(self._pending)} kept positions in its top-ranked block only"
        if self._current is None:
            return ""
        name = self._fixed.labels[self._current]
        if self._round_kind == "probe" and self._probe is not None:
            return f"{name}: {self._probes[0].label}"
        assert self._blocks is not None
        return f"{name}: {self._blocks.label('block', position)}"

    def facts(self) -> List[Dict[str, Any]]:
        """The kept ties: ``{"position": label, "nodes": kept node indices (sorted), "unit": whether they
        are kept as one unit rather than shown needed node by node}``, in the order decided."""
        return [{"position": label, "nodes": sorted(nodes), "unit": unit} for label, nodes, unit in self.kept]
