"""``runner.graph.boundary``: the array form of a subgraph's boundary gives what the node-by-node rule gives."""

from __future__ import annotations

import random

import pytest

from runner.graph.load import load_model
from tests.helpers.models import DETECTOR, VAD_IF, branchy_model, graph_index, need


def _walked(index, units):
    """The boundary rule walked node by node (the form it replaced): nodes with their constant dependencies;
    inputs in the order first read; outputs that are graph outputs or leave the set; else dangling ones."""
    keep = set(units)
    nodes = set(keep)
    for u in keep:
        nodes |= index.const_deps[u]
    order = sorted(nodes)
    produced = {t.name for i in order for t in index.nodes[i].outputs if t.name}
    inputs = []
    for i in order:
        for name in index.reads[i]:
            if name not in produced and name not in inputs:
                inputs.append(name)
    outputs, dangling = [], []
    for i in sorted(keep):
        for t in index.nodes[i].outputs:
            if not t.name:
                continue
            readers = index.consumers.get(t.name, [])
            if t.name in index.graph_outputs or (
                any(c not in nodes for c in readers) and not any(c in nodes for c in readers)
            ):
                outputs.append(t.name)
            elif not readers:
                dangling.append(t.name)
    return order, inputs, outputs or [n for n in dangling if index.meta.get(n) is not None]


@pytest.mark.parametrize(
    "build",
    [
        lambda: graph_index(load_model(need(DETECTOR)), {"x": [1, 3, 64, 64]}),
        lambda: graph_index(load_model(need(VAD_IF)), {"input": [1, 512], "state": [2, 1, 128]}),
        lambda: graph_index(branchy_model()),
    ],
    ids=["detector", "if-subgraphs", "branchy"],
)
def test_the_array_boundary_is_the_walked_one(build):
    index = build()
    rng = random.Random(1)
    units = sorted(index.units)
    sets = [units, units[:1], units[-1:]] + [rng.sample(units, rng.randint(1, len(units))) for _ in range(25)]
    for chosen in sets:
        assert index.boundary(chosen) == _walked(index, chosen)
