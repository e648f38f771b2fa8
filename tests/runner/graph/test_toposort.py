"""The stable topological sort that puts a conversion's appended Casts in place: valid on shuffled
graphs and subgraphs, order kept where it already holds, body reads counted as inputs."""

from __future__ import annotations

import random

import onnx
import pytest
from onnx import helper

from runner.graph.toposort import sort_topology


def _names(graph: onnx.GraphProto) -> list:
    return [n.name for n in graph.node]


def _is_sorted(graph: onnx.GraphProto, outer: frozenset = frozenset()) -> bool:
    made = set(outer) | {i.name for i in graph.input} | {""}
    produced = {o for n in graph.node for o in n.output}
    for node in graph.node:
        if any(i in produced and i not in made for i in node.input):
            return False
        made.update(node.output)
    return True


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
def test_shuffled_graphs_come_out_sorted_and_sorting_again_changes_nothing(seed):
    rng = random.Random(seed)
    graph = _random_graph(rng, rng.choice([1, 5, 40, 200]))
    sort_topology(graph)
    assert _is_sorted(graph)
    once = _names(graph)
    sort_topology(graph)
    assert _names(graph) == once, "a sorted graph keeps its order"


def test_an_appended_node_moves_up_behind_what_it_reads():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Relu", ["c"], ["b"], name="b")]
    nodes.append(helper.make_node("Cast", ["a"], ["c"], name="cast", to=10))
    graph = helper.make_graph(nodes, "g", [], [])
    sort_topology(graph)
    assert _names(graph) == ["a", "cast", "b"]


def test_a_body_read_from_outside_counts_as_an_input_of_its_node():
    """An If whose branch reads an outer tensor a later-listed Cast makes goes after that Cast
    (ONNX Runtime's converter appends such Casts after the If)."""
    body = helper.make_graph([helper.make_node("Relu", ["xc"], ["y"], name="inner")], "b", [], [])
    nodes = [
        helper.make_node("If", ["cond"], ["y"], name="if", then_branch=body, else_branch=body),
        helper.make_node("Cast", ["x"], ["xc"], name="cast", to=10),
    ]
    graph = helper.make_graph(nodes, "g", [], [])
    sort_topology(graph)
    assert _names(graph) == ["cast", "if"]


def test_subgraphs_are_sorted_too():
    body = _random_graph(random.Random(7), 30)
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=body)
    outer = _random_graph(random.Random(8), 20)
    outer.node.append(node)
    sort_topology(outer)
    assert _is_sorted(outer) and _is_sorted(outer.node[-1].attribute[0].g)


def test_a_cycle_is_an_error():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="p"), helper.make_node("Relu", ["a"], ["b"], name="q")]
    graph = helper.make_graph(nodes, "g", [], [])
    with pytest.raises(ValueError, match="cycle"):
        sort_topology(graph)
