"""Repeated blocks of a model: the layers of a transformer, the blocks of a ResNet or a UNet, and the
positions tied across them ("the score MatMul of every layer").

Two ways to find them, the first that finds any wins:

1. **Name scopes.** Exporters name a node after the module that made it: the TorchScript exporter's
   ``/m/encoder/layer.3/attention/self/MatMul``, the dynamo exporter's ``pkg.torch.onnx.name_scopes``
   metadata (``['', 'm', 'm.h.3', 'm.h.3.attn', ...]``), hand-built graphs' ``layers.3.self_attn.scores``.
   The outermost scope component of the form ``word.N`` (``layer.3``, ``h.3``, ``blocks.3``) names the
   node's block; the blocks of one family (the scope before it) repeat.
2. **Isomorphic runs.** Without such names, the topological sequence of node signatures (op type,
   input count, output rank) is searched for the period that repeats longest: runs of the same
   signatures back to back, each of ``MIN_BLOCK`` nodes or more and no repeat of a shorter period
   (a chain of one op type is no block structure).

A family counts with ``MIN_REPEATS`` blocks or more: tying fewer saves little and can trade a small
node-level answer for a larger tied one (the detector's three MobileNet stages).

A node's *position* in its block is its scope relative to the block, its op type, and its ordinal
among the block's nodes of that scope and op type in topological order (counters in node names
differ between blocks under the dynamo exporter, so names alone do not match), or its offset in
the period for isomorphic runs. A position held by two or more blocks is one *tie*.

Pure graph reading: no run, no model change.
"""

from __future__ import annotations

import ast
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np
import onnx

#: a family of blocks is tied only with this many blocks (named, or back to back)
MIN_REPEATS = 4
#: ... of this many nodes each (shorter periods are ops that merely alternate)
MIN_BLOCK = 8
#: ... covering this share of the searched nodes
MIN_COVER = 0.25

#: a scope component that numbers a block: ``layer.3``, ``h.3``, ``blocks.3``, ``down_blocks.1``
_NUMBERED = re.compile(r"(?:^|[./])([A-Za-z_][A-Za-z0-9_]*)\.(\d+)(?=[./]|$)")


@dataclass(frozen=True)
class Tie:
    """One position in every block that holds it.

    Attributes:
        label: the position for people: the nodes' common name with the block index as ``*``
            (``layers.*.self_attn.scores``), else ``family.*/scope: OpType #ordinal``.
        nodes: indices of its nodes, one per block, in block order.
        blocks: the labels of those blocks (``layers.0``, ...), in the same order.
    """

    label: str
    nodes: Tuple[int, ...]
    blocks: Tuple[str, ...]


@dataclass(frozen=True)
class Blocks:
    """What ``find_blocks`` found.

    Attributes:
        ties: the positions held by two or more blocks, in topological order of their first node.
        families: each family's label and its blocks' labels (``{"layers": ["layers.0", ...]}``).
        how: ``"name scopes"`` or ``"isomorphic runs"``.
    """

    ties: Tuple[Tie, ...]
    families: Dict[str, List[str]]
    how: str

    @property
    def tied_nodes(self) -> FrozenSet[int]:
        """Every node that belongs to a tie."""
        return frozenset(i for tie in self.ties for i in tie.nodes)

    def summary(self) -> Dict[str, object]:
        """For ``summary.json``: how the blocks were found, each family's block count, how many ties."""
        return {
            "found_by": self.how,
            "families": {name: len(blocks) for name, blocks in self.families.items()},
            "ties": len(self.ties),
            "tied_nodes": len(self.tied_nodes),
        }


def find_blocks(model: onnx.ModelProto, nodes: Sequence[int]) -> Optional[Blocks]:
    """The repeated blocks among ``nodes`` (indices into ``model.graph.node``, topological order).

    Args:
        model: the model (its main graph; node names and ``metadata_props`` are read).
        nodes: the nodes that may be tied (a search's nodes); others are ignored.

    Returns:
        The blocks and their ties, or None when no family repeats (a model without repeats).
    """
    by_scope = _by_scopes(model, nodes)
    if by_scope is not None:
        return by_scope
    return _by_isomorphic_runs(model, nodes)


def node_scope(node: onnx.NodeProto) -> str:
    """The module scope that made ``node``: the deepest module of the dynamo exporter's
    ``pkg.torch.onnx.name_scopes``, else the node's name without its last component (``/`` paths
    for the TorchScript exporter's names, ``.`` otherwise); "" when it has none."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            if isinstance(scopes, list) and len(scopes) >= 2:
                return str(scopes[-2])
    name = node.name
    separator = "/" if "/" in name else "."
    return name.rsplit(separator, 1)[0] if separator in name else ""


def _block_of(scope: str) -> Optional[Tuple[str, int, str]]:
    """(family, index, the scope inside the block) of the outermost numbered component of ``scope``."""
    found = _NUMBERED.search(scope)
    if found is None:
        return None
    family = scope[: found.start(2) - 1]
    return family, int(found.group(2)), scope[found.end(2) :]


def _by_scopes(model: onnx.ModelProto, nodes: Sequence[int]) -> Optional[Blocks]:
    graph = model.graph
    positions: Dict[Tuple[str, str, str, int], List[Tuple[int, int]]] = defaultdict(list)
    ordinals: Counter[Tuple[str, int, str, str]] = Counter()
    indices: Dict[str, Set[int]] = defaultdict(set)
    for i in nodes:
        node = graph.node[i]
        found = _block_of(node_scope(node))
        if found is None:
            continue
        family, index, inner = found
        ordinal_key = (family, index, inner, node.op_type)
        positions[(family, inner, node.op_type, ordinals[ordinal_key])].append((index, i))
        ordinals[ordinal_key] += 1
        indices[family].add(index)
    repeating = {family for family, seen in indices.items() if len(seen) >= MIN_REPEATS}
    ties = []
    for (family, inner, op_type, ordinal), held in positions.items():
        if family not in repeating or len(held) < 2:
            continue
        held.sort()
        members = tuple(i for _, i in held)
        ties.append(
            Tie(
                _label(graph, members, held, family, inner, op_type, ordinal),
                members,
                tuple(f"{family}.{index}" for index, _ in held),
            )
        )
    if not ties:
        return None
    ties.sort(key=lambda tie: tie.nodes[0])
    families = {family: [f"{family}.{index}" for index in sorted(indices[family])] for family in sorted(repeating)}
    return Blocks(tuple(ties), families, "name scopes")


def _label(
    graph: onnx.GraphProto,
    members: Tuple[int, ...],
    held: List[Tuple[int, int]],
    family: str,
    inner: str,
    op_type: str,
    ordinal: int,
) -> str:
    """The nodes' common name with the block index as ``*``, else ``family.*/scope: OpType #ordinal``."""
    names = set()
    for index, i in held:
        name = graph.node[i].name
        token = f"{family}.{index}"
        names.add(name.replace(token, f"{family}.*", 1) if token in name else name)
    if len(names) == 1:
        return names.pop()
    return f"{family}.*{inner}: {op_type} #{ordinal}"


def _signatures(model: onnx.ModelProto, nodes: Sequence[int]) -> List[Tuple[str, int, int]]:
    """(op type, input count, output rank or -1) of each node."""
    ranks: Dict[str, int] = {}
    for info in list(model.graph.value_info) + list(model.graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            ranks[info.name] = len(info.type.tensor_type.shape.dim)
    signatures = []
    for i in nodes:
        node = model.graph.node[i]
        rank = ranks.get(node.output[0], -1) if node.output else -1
        signatures.append((node.op_type, len(node.input), rank))
    return signatures


def _periodic(block: np.ndarray) -> bool:
    """Whether ``block`` repeats a shorter period itself (a chain of one op: no block structure)."""
    size = len(block)
    return any(size % p == 0 and np.array_equal(block[p:], block[:-p]) for p in range(1, size // 2 + 1))


def _by_isomorphic_runs(model: onnx.ModelProto, nodes: Sequence[int]) -> Optional[Blocks]:
    """The period of the longest run of repeated signatures in topological order (``MIN_REPEATS`` blocks or more)."""
    count = len(nodes)
    if count < MIN_REPEATS * MIN_BLOCK:
        return None
    codes = {s: k for k, s in enumerate(dict.fromkeys(_signatures(model, nodes)))}
    sequence = np.array([codes[s] for s in _signatures(model, nodes)])
    best: Optional[Tuple[int, int, int]] = None  # (covered nodes, period, start)
    for period in range(MIN_BLOCK, count // MIN_REPEATS + 1):
        same = np.concatenate([[False], sequence[period:] == sequence[:-period], [False]]).astype(np.int8)
        edges = np.flatnonzero(np.diff(same))
        starts, ends = edges[::2], edges[1::2]
        if not len(starts):
            continue
        longest = int(np.argmax(ends - starts))
        run = int(ends[longest] - starts[longest])
        repeats = (run + period) // period
        if repeats < MIN_REPEATS or _periodic(sequence[starts[longest] : starts[longest] + period]):
            continue
        covered = repeats * period
        if best is None or covered > best[0]:
            best = (covered, period, int(starts[longest]))
    if best is None or best[0] < MIN_COVER * count:
        return None
    covered, period, start = best
    repeats = covered // period
    labels = tuple(f"run.{b}" for b in range(repeats))
    ties = []
    for offset in range(period):
        members = tuple(nodes[start + b * period + offset] for b in range(repeats))
        names = {model.graph.node[i].name for i in members}
        label = f"run.*: {model.graph.node[members[0]].op_type} #{offset}"
        ties.append(Tie(label if len(names) > 1 else names.pop(), members, labels))
    return Blocks(tuple(ties), {"run": list(labels)}, "isomorphic runs")
