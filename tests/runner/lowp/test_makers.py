"""The candidate makers (``runner.lowp.makers``): each precision's record names its maker, and the maker's
candidates are its converter's or quantizer's, node for node."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from runner.errors import ConfigError
from runner.graph.qdq import quantized_nodes
from runner.lowp.calibration import calibrate
from runner.lowp.convert import Converter, prepare
from runner.lowp.makers import MAKERS, CastMaker, MixedMaker, OnnxRuntimeMaker, PlacedMaker, make_maker
from runner.lowp.precisions import FLOAT8, FLOAT16, INT8
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import prepare_int8
from tests.helpers.int8 import dense_model, samples


def _run(model: onnx.ModelProto, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_the_casts_maker_keeps_what_it_is_told_and_refuses_a_rest():
    model = prepare(dense_model(6), FLOAT16)
    maker = make_maker(model, FLOAT16)
    assert isinstance(maker, CastMaker) and maker.calibration is None
    kept = [model.graph.node[0].name]
    made = maker.candidate(kept)
    assert made.SerializeToString() == Converter(model, FLOAT16).convert(kept).SerializeToString()
    assert maker.describe(1, 6) == "1 of 6 nodes in float32"
    assert maker.switchboard("k") is maker.switchboard("k"), "one switched model per maker"
    with pytest.raises(ConfigError, match=r"float_precision=float16.*float16 has no such nodes"):
        maker.with_rest(FLOAT16)


@pytest.mark.parametrize("placement, kind", [("tensorrt", PlacedMaker), ("onnxruntime", OnnxRuntimeMaker)])
def test_the_qdq_maker_is_the_placement_the_options_name(placement, kind):
    model = prepare_int8(dense_model(6, channels=8))
    options = QuantOptions(placement=placement)
    maker = make_maker(model, INT8, calibrate(model, list(samples()), options), options)
    assert type(maker) is kind and maker.calibration is not None
    whole = maker.candidate([])
    names = [n.name for n in model.graph.node if n.name in quantized_nodes(whole)]
    assert names, "the full quantization quantizes the dense layers"
    assert quantized_nodes(maker.candidate(names[:1])) == quantized_nodes(whole) - {names[0]}
    # only TensorRT's placement is a sum of node choices: ONNX Runtime's quantizer decides from the neighbours
    assert (maker.switchboard("k") is None) == (kind is OnnxRuntimeMaker)


def test_int8_with_the_rest_in_fp16_keeps_fp32_where_told():
    model = prepare_int8(dense_model(6, channels=8), opset=19)
    options = QuantOptions()
    maker = make_maker(model, INT8, calibrate(model, list(samples()), options), options)
    mixed = maker.with_rest(FLOAT16)
    assert isinstance(mixed, MixedMaker) and mixed.calibration is maker.calibration
    feeds = next(samples())
    fp32 = [n.name for n in model.graph.node]
    # every node out of int8 and in fp32: the model itself, to the bit
    np.testing.assert_array_equal(_run(mixed.candidate_with(fp32, fp32), feeds), _run(model, feeds))
    types = {t.type.tensor_type.elem_type for t in mixed.candidate(fp32).graph.output}
    assert types == {onnx.TensorProto.FLOAT}, "the graph's outputs stay as declared"


def test_fp8_is_its_own_maker_and_a_record_without_one_is_the_tools_defect():
    model = prepare_int8(dense_model(4, channels=32), opset=19)
    options = QuantOptions()
    maker = make_maker(model, FLOAT8, calibrate(model, list(samples()), options), options)
    assert isinstance(maker, PlacedMaker)
    types = {i.data_type for i in maker.candidate([]).graph.initializer}
    assert onnx.TensorProto.FLOAT8E4M3FN in types
    assert set(MAKERS) == {"casts", "qdq", "fp8"}
    with pytest.raises(KeyError):
        make_maker(model, dataclasses.replace(FLOAT16, maker="no-such-maker"))


@pytest.mark.slow  # a 64 MB weight
def test_a_large_models_cast_candidates_hold_no_weights_so_they_may_be_built_ahead():
    """A model of 64 MB of weights (``MAP_BYTES``): its fp16 candidates point into the weight file, a graph of a few
    hundred bytes each (``CandidateMaker.weightless``: the precision search builds them ahead); a small model's and
    a quantizer's candidates hold their weights."""
    from onnx import helper, numpy_helper

    from examples.planted import f32, make_model
    from runner.graph.weight_file import MAP_BYTES

    side = int((MAP_BYTES // 4) ** 0.5)  # a side x side fp32 weight of MAP_BYTES
    weight = numpy_helper.from_array(np.full((side, side), 0.5, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"), helper.make_node("Relu", ["t"], ["y"], name="r")]
    large = prepare(make_model(nodes, [f32("x", [1, side])], [f32("y", [1, side])], [weight]), FLOAT16)
    maker = CastMaker(Converter(large))
    assert maker.weightless
    for kept in ([], ["mm"]):
        assert maker.candidate(kept).ByteSize() < 4096
    assert not CastMaker(Converter(prepare(dense_model(2), FLOAT16))).weightless
    int8 = prepare_int8(dense_model(2))
    assert not make_maker(int8, INT8, calibrate(int8, list(samples()), QuantOptions()), QuantOptions()).weightless
