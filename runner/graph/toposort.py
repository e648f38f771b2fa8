"""The node order onnxconverter-common's float16 converter sorts a graph into, in O(n log n).

``onnxconverter_common.float16.sort_topology`` (1.14 to 1.16) repeatedly scans the node list for
the first node none of whose inputs is still to be produced, and removes it: quadratic in the
nodes, about 0.3 s of every 0.5 s candidate of ``mode=precision`` on a 672-node detector, and
minutes on graphs of 20,000 nodes. ``sort_topology`` here gives exactly the same order (Kahn's
algorithm with a heap on the position, which picks that same first ready node each time), and
``linear_sort`` puts it in the converter's place while a conversion runs.
"""

from __future__ import annotations

import heapq
from contextlib import contextmanager
from typing import Dict, Iterator, List, Set

import onnx


def _sort_graph_nodes(graph: onnx.GraphProto) -> None:
    """Reorder ``graph.node`` in place as the converter's ``sort_graph_node`` does.

    Its rules, kept here: a tensor is awaited while some node outputs it and no node that outputs
    it has been placed yet; the next node placed is the earliest (in the current order) whose
    inputs are none awaited; placing stops once nothing is awaited, and the nodes not placed
    then keep their order ahead of the placed ones.

    Raises:
        ValueError: when nodes still await tensors and none is ready (a cycle).
    """
    nodes = list(graph.node)
    awaited: Set[str] = {name for node in nodes for name in node.output}
    blockers: List[int] = []
    waiting: Dict[str, List[int]] = {}
    ready: List[int] = []
    for position, node in enumerate(nodes):
        names = {name for name in node.input if name in awaited}
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
    """Sort ``graph`` and every subgraph below it, in place, as the converter's ``sort_topology``.

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


@contextmanager
def linear_sort() -> Iterator[None]:
    """While inside, the float16 converter sorts with ``sort_topology`` (same order, not quadratic).

    The converter's module attribute is swapped and put back; a conversion in another thread
    meanwhile gets the same order either way.
    """
    from onnxconverter_common import float16

    original = getattr(float16, "sort_topology", None)
    if original is None:  # a converter without it: nothing to replace
        yield
        return
    float16.sort_topology = sort_topology
    try:
        yield
    finally:
        float16.sort_topology = original
