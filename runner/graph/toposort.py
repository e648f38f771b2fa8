"""A stable topological sort of a graph's nodes, in O(n log n).

ONNX requires a graph's nodes in topological order; ONNX Runtime's float16 converter appends the
Casts it inserts after every other node. ``sort_topology`` places each node as early as its
inputs allow, and among ready nodes the one that came first (Kahn's algorithm with a heap on
the position), so a sorted graph keeps its order and an appended Cast moves up just behind
what it reads. A node's inputs include the tensors its bodies (If/Loop/Scan) read from outside.
"""

from __future__ import annotations

import heapq
from typing import Dict, List, Set

import onnx


def _sort_graph_nodes(graph: onnx.GraphProto) -> None:
    """Reorder ``graph.node`` in place (stable topological order).

    The rules: a tensor is awaited while some node outputs it and no node that outputs
    it has been placed yet; the next node placed is the earliest (in the current order) whose
    inputs are none awaited; placing stops once nothing is awaited, and the nodes not placed
    then keep their order ahead of the placed ones.

    Raises:
        ValueError: when nodes still await tensors and none is ready (a cycle).
    """
    from runner.graph.isolate import has_body, outer_scope_inputs

    nodes = list(graph.node)
    awaited: Set[str] = {name for node in nodes for name in node.output}
    blockers: List[int] = []
    waiting: Dict[str, List[int]] = {}
    ready: List[int] = []
    for position, node in enumerate(nodes):
        reads = set(node.input) | (set(outer_scope_inputs(node)) if has_body(node) else set())
        names = {name for name in reads if name in awaited}
        blockers.append(len(names))
        for name in names:
            waiting.setdefault(name, []).append(position)
        if not names:
            ready.append(position)
    heapq.heapify(ready)
    placed: List[int] = []
    done = [False] * len(nodes)
    while awaited:
        if not ready:
            raise ValueError("the graph has a cycle: no node is ready while tensors are still awaited")
        position = heapq.heappop(ready)
        done[position] = True
        placed.append(position)
        for name in nodes[position].output:
            if name in awaited:
                awaited.discard(name)
                for consumer in waiting.pop(name, []):
                    blockers[consumer] -= 1
                    if blockers[consumer] == 0:
                        heapq.heappush(ready, consumer)
    order = [p for p in range(len(nodes)) if not done[p]] + placed
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[p] for p in order)


def sort_topology(graph: onnx.GraphProto) -> None:
    """Sort ``graph`` and every subgraph below it, in place (stable topological order).

    Args:
        graph: the graph (a model's ``graph``, or an If/Loop/Scan body).

    Raises:
        ValueError: when a graph has a cycle.
    """
    _sort_graph_nodes(graph)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g") and len(attr.g.node) > 0:
                sort_topology(attr.g)
            for sub in attr.graphs:
                sort_topology(sub)
