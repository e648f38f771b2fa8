"""The float16 converter's node order, computed without its quadratic scan: exactly the order
``onnxconverter_common.float16.sort_topology`` gives, on shuffled graphs, subgraphs and real models."""

from __future__ import annotations

import contextlib
import random

import onnx
import pytest
from onnx import helper
from onnxconverter_common import float16

from runner.graph.constants import constants_to_initializers
from runner.graph.convert import convert_except, name_nodes
from runner.graph.toposort import linear_sort, sort_topology
from tests.helpers.models import CLASSIFIER, DETECTOR, VAD_IF, need


def _names(graph: onnx.GraphProto) -> list:
    return [n.name for n in graph.node]


def _both(graph: onnx.GraphProto) -> tuple:
    theirs, ours = onnx.GraphProto(), onnx.GraphProto()
    theirs.CopyFrom(graph)
    ours.CopyFrom(graph)
    float16.sort_topology(theirs)
    sort_topology(ours)
    return theirs, ours


def _random_graph(rng: random.Random, n: int) -> onnx.GraphProto:
    """A DAG of ``n`` nodes (some with two outputs, some reading an input twice or an optional ""),
    listed in a shuffled order."""
    tensors = ["x"]
    nodes = []
    for i in range(n):
        reads = rng.sample(tensors, min(len(tensors), rng.randint(1, 3)))
        if rng.random() < 0.1:
            reads = [*reads, reads[0]]
        if rng.random() < 0.05:
            reads = [*reads, ""]
        outs = [f"t{i}"] + ([f"t{i}b"] if rng.random() < 0.2 else [])
        nodes.append(helper.make_node("Sum", reads, outs, name=f"n{i}"))
        tensors += outs
    rng.shuffle(nodes)
    return helper.make_graph(nodes, "g", [], [])


@pytest.mark.parametrize("seed", range(30))
def test_the_order_is_the_converters_on_shuffled_graphs(seed):
    rng = random.Random(seed)
    theirs, ours = _both(_random_graph(rng, rng.choice([1, 5, 40, 200])))
    assert _names(ours) == _names(theirs)


def test_subgraphs_are_sorted_as_the_converter_sorts_them():
    body = _random_graph(random.Random(7), 30)
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=body)
    outer = _random_graph(random.Random(8), 20)
    outer.node.append(node)
    theirs, ours = _both(outer)
    assert _names(ours) == _names(theirs)
    assert _names(ours.node[-1].attribute[0].g) == _names(theirs.node[-1].attribute[0].g)


def test_a_cycle_is_an_error():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="p"), helper.make_node("Relu", ["a"], ["b"], name="q")]
    graph = helper.make_graph(nodes, "g", [], [])
    with pytest.raises(ValueError, match="cycle"):
        sort_topology(graph)


@pytest.mark.parametrize("path", [CLASSIFIER, DETECTOR, VAD_IF])
def test_converting_real_models_gives_the_model_the_converters_own_sort_gives(path, monkeypatch):
    """``convert_except``'s mixed-precision models are byte for byte the ones it makes with the
    converter's quadratic sort (the Casts around kept nodes are what the sort has to place)."""
    import runner.graph.convert as convert

    model = constants_to_initializers(name_nodes(onnx.load(str(need(path)))))
    keep = [n.name for n in model.graph.node][::7]
    fast = convert_except(model, keep)
    assert float16.sort_topology is not sort_topology  # put back after the conversion
    with linear_sort():
        assert float16.sort_topology is sort_topology
    monkeypatch.setattr(convert, "linear_sort", contextlib.nullcontext)
    slow = convert_except(model, keep)
    assert fast.SerializeToString() == slow.SerializeToString()
