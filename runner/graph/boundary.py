"""A subgraph's boundary, found with array operations over a graph's read and write edges.

``GraphIndex.boundary`` asks, for each candidate of a reduce, which nodes a unit set holds (with the
Constant nodes it reads), which tensors it reads that none of them writes (its graph inputs), and
which of its tensors leave it (its graph outputs). Walked node by node in Python that took 0.1 to
0.16 s for a 60,000-node candidate of a 100,000-node chain; over arrays of edges, built once per
graph, it is a few masks and counts (``benchmarks/scale.py``).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Sequence, Set, Tuple

import numpy as np


class Boundaries:
    """The read and write edges of one graph, for ``boundary`` queries.

    Args:
        reads: per node (in topological order), the tensor names it reads: its inputs and what its
            subgraphs read from the outer scope; a name may repeat.
        writes: per node, the names of its outputs (empty names left out).
        const_deps: per node, the Constant nodes (indices) it depends on through constant inputs.
        graph_outputs: the graph's output names.
    """

    def __init__(
        self,
        reads: Sequence[Sequence[str]],
        writes: Sequence[Sequence[str]],
        const_deps: Sequence[Set[int]],
        graph_outputs: Iterable[str],
    ):
        ids: Dict[str, int] = {}
        for names in list(writes) + list(reads):
            for name in names:
                ids.setdefault(name, len(ids))
        self.names: List[str] = list(ids)
        self.count = len(reads)
        self.read_node = np.repeat(np.arange(len(reads)), [len(r) for r in reads])
        self.read_tensor = np.fromiter((ids[n] for r in reads for n in r), np.int64, len(self.read_node))
        self.write_node = np.repeat(np.arange(len(writes)), [len(w) for w in writes])
        self.write_tensor = np.fromiter((ids[n] for w in writes for n in w), np.int64, len(self.write_node))
        self.producer = np.full(len(ids), -1, np.int64)
        self.producer[self.write_tensor] = self.write_node
        self.readers = np.bincount(self.read_tensor, minlength=len(ids))
        self.graph_output = np.zeros(len(ids), bool)
        self.graph_output[[ids[n] for n in graph_outputs if n in ids]] = True
        self.deps: Mapping[int, Set[int]] = {u: d for u, d in enumerate(const_deps) if d}

    def boundary(self, units: Iterable[int]) -> Tuple[List[int], List[str], List[str], List[str]]:
        """The subgraph of ``units``.

        Returns:
            (its node indices, sorted: the units and the Constant nodes they depend on; the tensors it
            reads that none of its nodes writes, in the order first read; the units' tensors that are
            graph outputs, or that a node outside reads and none inside does, in node then output
            order; the units' tensors nothing reads, in that order).
        """
        keep = np.zeros(self.count, bool)
        keep[np.fromiter(units, np.int64)] = True
        nodes = keep.copy()
        for u, deps in self.deps.items():
            if keep[u]:
                nodes[list(deps)] = True
        written_inside = np.zeros(len(self.names), bool)
        written = self.producer >= 0
        written_inside[written] = nodes[self.producer[written]]
        read = self.read_tensor[nodes[self.read_node] & ~written_inside[self.read_tensor]]
        _, first = np.unique(read, return_index=True)
        inputs = read[np.sort(first)]
        read_inside = np.bincount(self.read_tensor[nodes[self.read_node]], minlength=len(self.names))
        inside, outside = read_inside > 0, self.readers > read_inside
        mine = keep[self.write_node]
        leaves = self.graph_output | (outside & ~inside)
        outputs = self.write_tensor[mine & leaves[self.write_tensor]]
        dangling = self.write_tensor[mine & ~leaves[self.write_tensor] & (self.readers[self.write_tensor] == 0)]
        names = self.names
        return (
            np.flatnonzero(nodes).tolist(),
            [names[t] for t in inputs],
            [names[t] for t in outputs],
            [names[t] for t in dangling],
        )
