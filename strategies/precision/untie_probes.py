"""What the tied search tries first when it unties a kept tie (``strategies.precision.tied_search``, ``untie=auto``).

Pure: no I/O, no ONNX, no logging. A tie is one block position in every block (the score MatMul of every
layer); after the tied phase showed it needed, probes drop some of its blocks to see whether the rest suffice.
Which probes, and in which order, is decided from what is known:

- **Needed alike** (``alike``): a tie whose nodes the ranking puts within ``ALIKE`` times its block count of
  each other (attention's Softmax of every layer ranked one after another) is taken as needed in every block:
  one probe, its lower-ranked half, whose failure keeps it whole.
- **The blocks the ties before kept** (``usual_blocks``): where errors the blocks amplify make the first blocks
  need fp32, every position needs about the same blocks; once a tie kept some of its blocks, the next is first
  tried in the blocks kept most often so far (the latest of equals), then trimmed from its lowest-ranked block
  while that passes (``Probe.trims``).
- Otherwise the **halves**: the lower-ranked half dropped, then the later half (errors the blocks after them
  amplify are likeliest needed first).
"""

from __future__ import annotations

from typing import Collection, Dict, FrozenSet, List, NamedTuple, Optional, Sequence

#: a tie whose nodes the ranking puts within ``ALIKE`` times its block count of each other (other positions' nodes
#: among them fewer than half its blocks) is taken as needed alike in every block: one probe, whose failure keeps
#: it whole. Attention's positions in a decoder whose blocks amplify errors rank contiguously (spread 23 at 24
#: layers); its input norm's Pow, needed in one block, spread 42: at 2 it was kept in all 24
ALIKE = 1.5


class Probe(NamedTuple):
    """A probe of the tie being untied: the candidate drops ``dropped``; a pass leaves ``rest`` (in the order
    searched next); ``trims``: after a pass, the lowest-ranked block left is dropped next, while that passes
    (the first failure leaves the rest as one unit), instead of a group search over ``rest``."""

    dropped: FrozenSet[int]
    rest: List[int]
    label: str
    trims: bool = False


def alike(nodes: Collection[int], ranks: Dict[int, int]) -> bool:
    """Whether the ranking (``ranks``: node -> rank) puts a tie's ``nodes`` within ``ALIKE`` times their count of
    each other: needed alike in every block, by its account."""
    spread = [ranks[n] for n in nodes]
    return max(spread) - min(spread) < ALIKE * len(spread)


def usual_blocks(learned: Sequence[FrozenSet[int]], blocks: int) -> Optional[FrozenSet[int]]:
    """The block indices the ties decided so far kept most often (``learned``: one set per tie that kept some of
    its blocks, in the order decided; the latest of equals), where they fit a tie of ``blocks`` blocks; None
    before any tie kept part of its blocks."""
    fitting = [b for b in learned if max(b) < blocks]
    if not fitting:
        return None
    return max(reversed(fitting), key=fitting.count)


def first_probes(ranked: List[int], ranks: Dict[int, int], learned: Sequence[FrozenSet[int]]) -> List[Probe]:
    """The probes of a tie, in the order tried, none dropping what another drops.

    Args:
        ranked: the tie's nodes (one a block) in the ranking's order, most likely needed first; node indices
            are in topological order, so sorting them gives block order.
        ranks: node -> rank.
        learned: the block indices each tie decided before kept, where it kept some but not all.

    Returns:
        One probe for a tie needed alike in every block; else the usual blocks' probe (when ``learned`` has one)
        before the two halves.
    """
    half, blocks = (len(ranked) + 1) // 2, len(ranked)
    in_blocks = sorted(ranked)
    dropped = blocks - half
    probes = [
        Probe(frozenset(ranked[half:]), ranked[:half], f"without its lower-ranked {dropped} of {blocks} blocks"),
        Probe(frozenset(in_blocks[half:]), in_blocks[:half], f"without its last {dropped} of {blocks} blocks"),
    ]
    if alike(ranked, ranks):
        probes = probes[:1]
    elif (usual := usual_blocks(learned, blocks)) is not None:
        kept = [n for n in ranked if in_blocks.index(n) in usual]
        label = f"in the {len(kept)} of {blocks} blocks the ties before it kept most often"
        probes.insert(0, Probe(frozenset(ranked) - frozenset(kept), kept, label, trims=True))
    distinct: List[Probe] = []
    for probe in probes:
        if all(probe.dropped != p.dropped for p in distinct):
            distinct.append(probe)
    return distinct


def trimmed(probe: Probe) -> Probe:
    """After ``probe`` (a trimming one) passed: the next, dropping the lowest-ranked block it left."""
    label = f"without the lowest-ranked of the {len(probe.rest)} blocks it keeps"
    return Probe(frozenset(probe.rest[-1:]), probe.rest[:-1], label, trims=True)
