"""GraphIndex: units, boundaries, extraction, on-demand reachability and keys, on built graphs and the real models."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from runner.errors import ModelError, ShapeError
from runner.graph.meta import TensorMeta
from runner.graph.subgraph import GraphIndex
from tests.helpers.models import CLASSIFIER, VAD_IF, branchy_model, chain_model, f32, graph_index, make_model, need


def _names(index, units):
    return [index.nodes[i].name for i in sorted(units)]


def test_constant_nodes_are_not_units():
    index = graph_index(chain_model(4))
    assert [index.nodes[i].name for i in index.units] == ["n0", "n1", "n2", "n3"]
    assert len(index.nodes) == 5


def test_boundary_of_a_middle_node():
    index = graph_index(chain_model(4))
    n2 = index.find("n2")
    order, inputs, outputs = index.boundary([n2])
    assert inputs == ["t1"] and outputs == ["t2"]
    assert _names(index, order) == ["n2"], "n2 is a Relu and reads no constant"
    n1 = index.find("n1")
    order, inputs, _ = index.boundary([n1])
    assert _names(index, order) == ["const", "n1"], "the Constant travels with the Add that reads it"
    assert inputs == ["t0"], "a constant never becomes a graph input"


def test_extracted_subgraph_runs_and_matches_the_original():
    model = branchy_model()
    index = graph_index(model)
    units = [index.find("b1"), index.find("b2"), index.find("side_out")]
    sub = index.extract(units)
    onnx.checker.check_model(sub)
    assert [i.name for i in sub.graph.input] == ["b0o"]
    assert [o.name for o in sub.graph.output] == ["side"], (
        "b2o is read by join, outside the set, but also by side_out inside it: not an output (Polygraphy's rule)"
    )
    dims = [d.dim_value for d in sub.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 4]
    x = np.random.default_rng(0).random((1, 4), dtype=np.float32)
    full = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    part = ort.InferenceSession(sub.SerializeToString()).run(None, {"b0o": -x})
    np.testing.assert_allclose(part[0], full[1], rtol=1e-6)


def test_constants_become_initializers_unless_kept():
    model = chain_model(4)
    n1 = [graph_index(model).find("n1")]
    assert [n.op_type for n in graph_index(model).extract(n1).graph.node] == ["Add"]
    kept = graph_index(model, keep_constant_nodes=True).extract(n1)
    assert [n.op_type for n in kept.graph.node] == ["Constant", "Add"]


def test_reachable_walks_parents_and_children():
    index = graph_index(branchy_model())
    a1 = index.find("a1")
    assert _names(index, index.reachable([a1], upward=True)) == ["a0"]
    assert _names(index, index.reachable([a1], upward=False)) == ["a2", "join"]
    b0 = index.find("b0")
    assert set(_names(index, index.reachable([b0], upward=False))) == {"b1", "b2", "join", "side_out"}


def test_candidate_keys_depend_on_the_set_and_on_kept_constants(tmp_path):
    from strategies.bisect import BisectMarker
    from strategies.reduce import ReduceStrategy

    model = chain_model(4)
    strategy = ReduceStrategy(graph_index(model), BisectMarker, output=tmp_path / "r.onnx")
    assert strategy.key(frozenset([1, 2])) == strategy.key(frozenset([2, 1])) != strategy.key(frozenset([1]))
    kept = ReduceStrategy(graph_index(model, keep_constant_nodes=True), BisectMarker, output=tmp_path / "r.onnx")
    assert strategy.key(frozenset([1])) != kept.key(frozenset([1]))


def test_bad_graphs():
    with pytest.raises(ModelError, match="no nodes"):
        graph_index(make_model([], [f32("x", [1])], [f32("x", [1])]))
    missing = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g", [f32("x", [1])], [f32("y", [1])]
    )
    model = helper.make_model(missing, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match="'w'"):
        graph_index(model)


def test_a_tensor_without_shape_names_the_option():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Neg", ["a"], ["y"], name="n")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], [f32("y", None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    index = GraphIndex(model, TensorMeta(model, {}, lambda: {}))
    with pytest.raises(ShapeError, match="model_input_shapes"):
        index.extract([index.find("n")])


def test_if_node_is_one_unit_and_its_outer_reads_are_inputs():
    model = onnx.load(str(need(VAD_IF)))
    index = graph_index(model, {"input": [1, 512], "state": [2, 1, 128]})
    ifs = [i for i in index.units if index.nodes[i].op == "If"]
    assert ifs, "the model's work is in If nodes"
    _, inputs, _ = index.boundary([ifs[0]])
    assert inputs, "the branch bodies read outer-scope tensors, which become inputs"


def test_every_single_node_of_the_classifier_extracts_and_checks():
    model = onnx.load(str(need(CLASSIFIER)))
    index = graph_index(model, {"x": [1, 3, 48, 192]})
    for u in index.units[::25]:
        onnx.checker.check_model(index.extract([u]))


def _graphsurgeon_export(index, order, inputs, outputs):
    """The subgraph as onnx-graphsurgeon's own exporter writes it (what ``PartsExporter`` replaces)."""
    import onnx_graphsurgeon as gs

    sub = gs.Graph(
        nodes=[index.nodes[i] for i in order],
        inputs=[index.tensor_map[n] for n in inputs],
        outputs=[index.tensor_map[n] for n in outputs],
        name=index.graph.name,
        doc_string=index.graph.doc_string,
    )
    return gs.export_onnx(sub, do_type_check=False).graph


@pytest.mark.parametrize("name", ["classifier", "if_model"])
def test_graph_proto_is_what_graphsurgeon_exports_for_the_same_subgraph(name):
    """The parts exported once and reused give, candidate after candidate, the graph graphsurgeon's exporter
    writes: the same nodes, initializers, inputs, outputs and value infos, byte for byte (If bodies included)."""
    if name == "classifier":
        model, shapes = onnx.load(str(need(CLASSIFIER))), {"x": [1, 3, 48, 192]}
    else:
        model, shapes = onnx.load(str(need(VAD_IF))), {"input": [1, 512], "state": [2, 1, 128]}
    index = graph_index(model, shapes)
    rng = np.random.default_rng(0)
    for _ in range(6):  # twice over the same nodes: the second pass reuses the exported parts
        units = sorted(rng.choice(index.units, size=max(1, len(index.units) // 3), replace=False).tolist())
        order, inputs, outputs = index.boundary(units)
        ours = index.exporter.graph_proto(order, inputs, outputs)
        assert ours.SerializeToString() == _graphsurgeon_export(index, order, inputs, outputs).SerializeToString()
