"""Mixed-precision conversion: kept nodes stay fp32, I/O types stay, bf16 weights come from fp32 values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from examples.planted import one_sensitive
from runner.errors import ModelError
from runner.graph.constants import constants_to_initializers, fold_weight_identities
from runner.graph.validate import strict_problem
from runner.lowp.convert import (
    Converter,
    convert_except,
    float_nodes,
    name_nodes,
    onnx_opset,
    ops_without,
    prepare,
    to_low_precision,
)
from tests.helpers.models import chain_model, f32, make_model, need


def _types(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    vis = list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    return {v.name: v.type.tensor_type.elem_type for v in vis}


def test_name_nodes_makes_names_unique():
    model = chain_model(3)
    model.graph.node[1].name = ""
    model.graph.node[2].name = model.graph.node[3].name
    names = [n.name for n in name_nodes(model).graph.node]
    assert len(set(names)) == len(names) and all(names)


def test_constants_to_initializers_keeps_names():
    model = constants_to_initializers(chain_model(2))
    assert [n.op_type for n in model.graph.node] == ["Relu", "Add"]
    assert [t.name for t in model.graph.initializer] == ["c"]


def test_kept_node_stays_fp32_and_io_types_are_kept():
    model, needed, _ = one_sensitive()
    model = constants_to_initializers(name_nodes(model))
    converted = convert_except(model, needed)
    types = _types(converted)
    assert converted.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert converted.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    mul = next(n for n in converted.graph.node if n.name == "big_mul")
    assert all(types.get(t) == TensorProto.FLOAT for t in mul.output)
    assert {t.name: t.data_type for t in converted.graph.initializer}["C"] == TensorProto.FLOAT, (
        "the kept weight stays fp32"
    )
    relu = next(n for n in converted.graph.node if n.name == "relu1")
    assert types[relu.output[0]] == TensorProto.FLOAT16
    x = np.full((1, 8), 2.0, np.float32)
    y = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, 2e5, rtol=1e-3)


def test_bf16_weights_come_from_fp32_values():
    w = numpy_helper.from_array(np.array([1e6], np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"], name="mul")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    converted = convert_except(model, [], "bfloat16")
    init = {t.name: t for t in converted.graph.initializer}["w"]
    assert init.data_type == TensorProto.BFLOAT16
    value = numpy_helper.to_array(init).astype(np.float32)
    assert value[0] == pytest.approx(1e6, rel=1e-2), "not clipped to fp16's 65504"


def test_bf16_conversion_of_a_model_below_opset_13_is_refused_unless_prepared():
    """``convert_except`` takes a prepared model; ``to_low_precision`` raises the opset first."""
    model = chain_model(2)
    model.opset_import[0].version = 11
    with pytest.raises(ModelError, match="opset 13"):
        convert_except(constants_to_initializers(model), [], "bfloat16")


def test_float_nodes_skip_integer_only_nodes():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Add", ["s", "s"], ["s2"], name="int_add"),
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("s2", TensorProto.INT64, [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    names = [model.graph.node[i].name for i in float_nodes(model)]
    assert "relu" in names and "int_add" not in names


def test_a_kept_last_node_keeps_the_output_in_fp32():
    """The converter ends a blocked producer's graph output with a Cast to float16; it is retargeted, so the
    all-fp32 candidate really is fp32 up to the output (2e5 would overflow fp16)."""
    model, _, _ = one_sensitive()
    model = constants_to_initializers(name_nodes(model))
    converted = convert_except(model, [n.name for n in model.graph.node])
    assert converted.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    x = np.full((1, 8), 2.0, np.float32)
    y = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, np.full((1, 8), 2e5, np.float32))


def _rt(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def test_a_graph_output_also_read_inside_stays_consistent():
    """BERT's last_hidden_state is a graph output that its pooler also reads: the conversion loads, the
    output keeps float32, and the reader gets the low-precision tensor (onnxconverter-common failed here)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Neg", ["h"], ["p"], name="pooler"),
    ]
    model = make_model(nodes, [f32("x", [2])], [f32("h", [2]), f32("p", [2])])
    converted = convert_except(model, [])
    assert strict_problem(converted) is None
    h, p = _rt(converted, np.array([1.0, -2.0], np.float32))
    assert h.dtype == np.float32 and list(p) == [-1.0, 0.0]


def test_a_weight_shared_by_a_kept_and_a_converted_node_reaches_the_kept_one_unrounded():
    w = numpy_helper.from_array(np.array([1.0 + 2**-20], np.float32), "w")  # rounds to 1.0 in fp16
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["a"], name="kept"),
        helper.make_node("Mul", ["x", "w"], ["b"], name="converted"),
        helper.make_node("Sub", ["a", "x"], ["y"], name="kept_sub"),
    ]
    model = make_model(nodes, [f32("x", [1])], [f32("y", [1]), f32("b", [1])], [w])
    converted = convert_except(model, ["kept", "kept_sub"])
    inits = {t.name: t.data_type for t in converted.graph.initializer}
    assert inits["w"] == TensorProto.FLOAT16 and inits["w_fp32"] == TensorProto.FLOAT
    y, _ = _rt(converted, np.array([1.0], np.float32))
    assert y[0] == pytest.approx(2**-20, rel=1e-3), "kept nodes compute with the fp32 weight, no round trip"


def test_identity_forwarded_weights_are_folded():
    w = numpy_helper.from_array(np.ones(2, np.float32), "w")
    nodes = [
        helper.make_node("Identity", ["w"], ["w_fwd"], name="fwd"),
        helper.make_node("Add", ["x", "w_fwd"], ["y"], name="add"),
    ]
    folded = fold_weight_identities(make_model(nodes, [f32("x", [2])], [f32("y", [2])], [w]))
    assert [n.name for n in folded.graph.node] == ["add"] and list(folded.graph.node[0].input) == ["x", "w"]


def test_bf16_keeps_ops_whose_schema_has_no_bf16_in_fp32_and_raises_the_opset():
    """Conv has no bfloat16 before opset 22; a model at opset 11 has no bfloat16 Cast either."""

    def one(op: str, *inputs: str) -> onnx.ModelProto:
        graph = helper.make_graph([helper.make_node(op, list(inputs), ["y"])], "g", [], [])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    assert ops_without(one("Conv", "x", "w"), "bfloat16") == ["Conv"]
    assert ops_without(one("LayerNormalization", "x", "s"), "float16") == [], "its fp32 statistics do not count"
    model = chain_model(2)
    model.opset_import[0].version = 11
    converted = to_low_precision(model, "bfloat16")
    assert onnx_opset(converted) == 13 and strict_problem(converted) is None


def test_duplicate_casts_of_an_older_converter_are_dropped():
    """onnxruntime < 1.32's converter gives each fp32 reader of an fp16 tensor its own Cast, all
    named ``<tensor>_cast_to_fp32``: one is kept, the graph is valid again and computes the same."""
    from runner.lowp.conversion_repairs import drop_duplicate_casts

    cast = helper.make_node("Cast", ["h"], ["h_cast_to_fp32"], to=TensorProto.FLOAT, name="h_cast_to_fp32_node")
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="to_half"),
        cast,
        helper.make_node("Relu", ["h_cast_to_fp32"], ["a"], name="a"),
        helper.make_node("Cast", ["h"], ["h_cast_to_fp32"], to=TensorProto.FLOAT, name="h_cast_to_fp32_node"),
        helper.make_node("Neg", ["h_cast_to_fp32"], ["b"], name="b"),
        helper.make_node("Cast", ["h"], ["h_other"], to=TensorProto.FLOAT, name="other"),  # not a duplicate
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "a", "b", "h_other")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [io[0]], io[1:]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with pytest.raises(onnx.checker.ValidationError, match="SSA"):
        onnx.checker.check_model(model)
    assert drop_duplicate_casts(model.graph) == 1
    onnx.checker.check_model(model)
    assert [n.name for n in model.graph.node] == ["to_half", "h_cast_to_fp32_node", "a", "b", "other"]


@pytest.mark.slow
@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_weightless_conversion_and_emulation_match_the_whole_model_ones(monkeypatch, low):
    """Candidates are converted and emulated on the graph alone, each weight converted once per run
    (``runner.graph.stubs``): the models are the ones made with every weight copied and converted
    each time (values of every initializer, nodes), on a real model with shared weights (BERT)."""
    import runner.graph.stubs as stubs
    from runner.lowp.emulate import emulate_low_precision
    from tests.helpers.models import MODELS

    model = prepare(onnx.load(str(need(MODELS / "zoo" / "bert_tiny.onnx"))), low)
    names = [model.graph.node[i].name for i in float_nodes(model)]
    rng = np.random.default_rng(0)
    keeps = [[], names[::3], list(rng.choice(names, 20, replace=False))]
    fast = Converter(model, low)
    made = [fast.convert(k) for k in keeps]
    monkeypatch.setattr(stubs, "STUB_BYTES", 1 << 62)  # no stubs: every weight in every copy, as before
    whole = Converter(model, low)
    for keep, got in zip(keeps, made):
        want = whole.convert(keep)
        assert [n.SerializeToString() for n in got.graph.node] == [n.SerializeToString() for n in want.graph.node]
        values = {i.name: numpy_helper.to_array(i) for i in want.graph.initializer}
        assert sorted(values) == sorted(i.name for i in got.graph.initializer)
        for init in got.graph.initializer:
            assert init.data_type == next(i.data_type for i in want.graph.initializer if i.name == init.name)
            np.testing.assert_array_equal(numpy_helper.to_array(init), values[init.name], err_msg=init.name)
        emulated, emulated_whole = emulate_low_precision(got)[0], emulate_low_precision(want)[0]
        expected = {i.name: numpy_helper.to_array(i) for i in emulated_whole.graph.initializer}
        for init in emulated.graph.initializer:
            np.testing.assert_array_equal(numpy_helper.to_array(init), expected[init.name], err_msg=init.name)


def test_every_kept_means_the_model_as_given_and_numeric_constants_convert():
    """With every node kept the candidate is the model as given, node for node and bit for bit on CPU (no identity
    Cast at a graph output); Constant nodes given as ``value_float``/``value_ints`` become initializers like tensor
    ones (before, the converter retyped ``value_float``'s output to fp16 and the candidate was invalid)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import helper

    from examples.planted import f32, make_model
    from runner.lowp.convert import Converter, prepare
    from runner.lowp.precisions import FLOAT16

    nodes = [
        helper.make_node("Constant", [], ["half"], name="c", value_float=0.5),
        helper.make_node("Constant", [], ["shape"], name="s", value_ints=[1, 8]),
        helper.make_node("Mul", ["x", "half"], ["t0"], name="scale"),
        helper.make_node("Softmax", ["t0"], ["t1"], name="softmax"),
        helper.make_node("Reshape", ["t1", "shape"], ["y"], name="out"),
    ]
    model = make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])])
    prepared = prepare(model, FLOAT16)
    assert not [n for n in prepared.graph.node if n.op_type == "Constant"]
    converter = Converter(prepared, FLOAT16)
    kept = converter.convert([n.name for n in prepared.graph.node])
    assert (
        [n.op_type for n in kept.graph.node]
        == [n.op_type for n in prepared.graph.node]
        == ["Mul", "Softmax", "Reshape"]
    )
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32) * 100}
    given, built = (ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0] for m in (model, kept))
    assert given.tobytes() == built.tobytes()
    onnx.checker.check_model(converter.convert(["softmax"]), full_check=True)
