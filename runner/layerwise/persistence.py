"""Which divergences reach a graph output, and which node absorbs the others.

A node's outputs can break the tolerance in the low-precision run and yet not matter: GPT-2's
causal mask adds float32's lowest value (-3.4e38), which is -inf in fp16, and the Softmax that
reads it gives the same probabilities either way. Reporting that Add as the first divergence
sends a user to the wrong node. Here a diverging node's error *persists* when some path of
diverging nodes leads from it to a graph output; otherwise it is *absorbed*, and the absorber is
the first node (in topological order) on its paths whose outputs are back within tolerance (the
Softmax, a Clip, a comparison).

Nodes the comparison does not judge (the Casts a conversion inserted) pass a divergence on: they
diverge when a node they read diverges.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import onnx

from runner.graph.isolate import has_body, outer_scope_inputs


def trace(
    model: onnx.ModelProto,
    judged: Set[str],
    diverging: Set[str],
    excluded: Optional[Set[str]] = None,
) -> Tuple[Set[str], Dict[str, Optional[str]]]:
    """Split ``diverging`` into the nodes whose divergence persists and the absorbed ones.

    Args:
        model: the target model, nodes in topological order (top-level graph).
        judged: names of the nodes the comparison judged (its rows).
        diverging: names of judged nodes whose outputs break the tolerance.
        excluded: graph outputs left out of the comparison (``checker.exclude_outputs``): a divergence
            that reaches only them does not persist.

    Returns:
        (names whose divergence reaches a graph output through diverging nodes; ``{absorbed node:
        the earliest node within tolerance that reads it through diverging nodes}``, None as the
        absorber of a node whose outputs nothing reads).
    """
    paths = _Paths(model, judged, diverging, excluded or set())
    return paths.persists, paths.absorbed


class _Paths:
    """The divergence paths of one model: computed once in topological order and back."""

    def __init__(self, model: onnx.ModelProto, judged: Set[str], diverging: Set[str], excluded: Set[str]):
        nodes = list(model.graph.node)
        producer: Dict[str, int] = {}
        for i, node in enumerate(nodes):
            for out in node.output:
                if out:
                    producer[out] = i
        reads: List[Set[int]] = []
        for node in nodes:
            names = set(node.input) | (set(outer_scope_inputs(node)) if has_body(node) else set())
            reads.append({producer[n] for n in names if n in producer})
        consumers: List[List[int]] = [[] for _ in nodes]
        for i, sources in enumerate(reads):
            for j in sources:
                consumers[j].append(i)
        div = [False] * len(nodes)
        for i, node in enumerate(nodes):  # topological order: a pass-through node follows what it reads
            div[i] = node.name in diverging if node.name in judged else any(div[j] for j in reads[i])
        outputs = {o.name for o in model.graph.output} - excluded
        reaches = [False] * len(nodes)
        for i in range(len(nodes) - 1, -1, -1):
            reaches[i] = div[i] and (
                any(o in outputs for o in nodes[i].output) or any(reaches[c] for c in consumers[i])
            )
        self.persists = {nodes[i].name for i in range(len(nodes)) if reaches[i] and nodes[i].name in diverging}
        self.absorbed: Dict[str, Optional[str]] = {
            node.name: self._first_within(i, div, consumers, nodes)
            for i, node in enumerate(nodes)
            if node.name in diverging and not reaches[i]
        }

    @staticmethod
    def _first_within(
        start: int, div: List[bool], consumers: List[List[int]], nodes: List[onnx.NodeProto]
    ) -> Optional[str]:
        """The earliest node within tolerance that reads ``start``'s divergence through diverging nodes."""
        seen: Set[int] = {start}
        frontier: List[int] = [start]
        found: List[int] = []
        while frontier:
            nxt: List[int] = []
            for i in frontier:
                for c in consumers[i]:
                    if c in seen:
                        continue
                    seen.add(c)
                    (nxt if div[c] else found).append(c)
            frontier = nxt
        return nodes[min(found)].name if found else None
