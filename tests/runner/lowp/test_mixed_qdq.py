"""int8 with the rest in fp16: the converter's Casts folded into Q/DQ typed fp16 (opset 19), as TensorRT fuses them."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from runner.lowp.calibration import calibrate
from runner.lowp.mixed_qdq import FP16_TINY, MIXED_OPSET, MixedQuantizer
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import make_quantizer, prepare_int8
from tests.helpers.int8 import conv_outlier_model, fp16_and_int8_model
from tests.helpers.models import DETECTOR, need


def _samples(count: int = 4) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(count)]


def _mixed(model: onnx.ModelProto) -> MixedQuantizer:
    prepared = prepare_int8(model, opset=MIXED_OPSET)
    options = QuantOptions()
    return MixedQuantizer(make_quantizer(prepared, calibrate(prepared, _samples(), options), options))


def _run(model: onnx.ModelProto, feeds: Dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _by_output(model: onnx.ModelProto) -> Dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _scale_type(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    return next(i.data_type for i in model.graph.initializer if i.name == node.input[1])


def test_qdq_against_fp16_nodes_is_typed_fp16_with_no_cast_between():
    """Every Q/DQ of a node in fp16 reads or gives fp16 itself (no Cast between it and its node), the model is
    valid ONNX at opset 19, and it computes what the fp32 QDQ model does within fp16 rounding."""
    mixed = _mixed(fp16_and_int8_model())
    made = mixed.convert([], ["shrink"])
    onnx.checker.check_model(made, full_check=True)
    assert max(o.version for o in made.opset_import if o.domain in ("", "ai.onnx")) == MIXED_OPSET
    producer = _by_output(made)
    for conv in (n for n in made.graph.node if n.op_type == "Conv"):
        dq_x, dq_w = producer[conv.input[0]], producer[conv.input[1]]
        assert dq_x.op_type == dq_w.op_type == "DequantizeLinear", conv.name
        assert _scale_type(made, dq_w) == TensorProto.FLOAT16
    conv2 = next(n for n in made.graph.node if n.name == "conv2")
    q = producer[producer[conv2.input[0]].input[0]]
    assert q.op_type == "QuantizeLinear" and producer[q.input[0]].name == "conv1", "Q reads conv1's fp16 output"
    assert _scale_type(made, q) == TensorProto.FLOAT16
    feeds = _samples(1)[0]
    want = _run(mixed.quantizer.convert([]), feeds)
    got = _run(made, feeds)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02


def test_qdq_against_a_node_kept_fp32_stays_fp32():
    """conv2 kept in fp32: the DequantizeLinear it reads gives fp32 with an fp32 scale, read directly."""
    mixed = _mixed(fp16_and_int8_model())
    made = mixed.convert([], ["conv2", "shrink"])
    producer = _by_output(made)
    conv2 = next(n for n in made.graph.node if n.name == "conv2")
    for slot in (0, 1):
        dq = producer[conv2.input[slot]]
        assert dq.op_type == "DequantizeLinear" and _scale_type(made, dq) == TensorProto.FLOAT


def test_a_node_out_of_int8_reads_its_input_unquantized_in_fp16():
    mixed = _mixed(fp16_and_int8_model())
    made = mixed.convert(["conv2"], ["shrink"])
    conv2 = next(n for n in made.graph.node if n.name == "conv2")
    producer = _by_output(made)
    assert producer[conv2.input[0]].name == "conv1"
    assert next(i for i in made.graph.initializer if i.name == conv2.input[1]).data_type == TensorProto.FLOAT16


def test_a_weight_channel_scale_below_fp16_normals_is_raised_and_the_channel_quantized_again():
    """A channel of weights near zero (1e-30) has a per-channel scale fp16 cannot hold: it is raised to the
    smallest normal fp16 number, its int8 values quantized again (to 0), and the weight's DequantizeLinear still
    feeds the conv in fp16; the other channels keep their values."""
    model = conv_outlier_model()
    w1 = next(i for i in model.graph.initializer if i.name == "w1")
    values = numpy_helper.to_array(w1).copy()
    values[3] = 1e-30
    w1.CopyFrom(numpy_helper.from_array(values, "w1"))
    mixed = _mixed(model)
    made = mixed.convert([], [])
    conv1 = next(n for n in made.graph.node if n.name == "conv1")
    dq = _by_output(made)[conv1.input[1]]
    inits = {i.name: numpy_helper.to_array(i) for i in made.graph.initializer}
    scale = inits[dq.input[1]]
    assert scale.dtype == np.float16 and scale.min() >= FP16_TINY
    weights = inits[dq.input[0]].astype(np.float32) * scale.astype(np.float32).reshape(-1, 1, 1, 1)
    assert np.all(weights[3] == 0)
    step = np.abs(values).reshape(8, -1).max(axis=1) / 127
    assert np.all(np.abs(weights[:3] - values[:3]) <= step[:3].reshape(-1, 1, 1, 1) * 0.51 + 1e-3)


def _same_outputs(fast: onnx.ModelProto, whole: onnx.ModelProto, feeds: Dict[str, np.ndarray]) -> bool:
    return bool(np.array_equal(_run(fast, feeds), _run(whole, feeds), equal_nan=True))


def test_a_node_out_of_int8_made_from_the_fully_quantized_model_is_the_whole_conversion():
    """The fast candidate (nodes bypassing their Q/DQ in the converted fully quantized model) is valid ONNX and
    gives the bits of the candidate converted whole; a node out of int8 kept in fp32 is converted whole."""
    mixed = _mixed(fp16_and_int8_model())
    feeds = _samples(1)[0]
    fast = mixed.convert(["conv2"], ["shrink"])
    assert mixed._converter is not None and mixed._converter[0] == (), "made from the fully quantized model"
    onnx.checker.check_model(fast, full_check=True)
    assert _same_outputs(fast, mixed._converted(["conv2"], ["shrink"]), feeds)
    both = mixed.convert(["conv2"], ["conv2", "shrink"])  # out of int8 and fp32: the whole conversion
    assert _same_outputs(both, mixed._converted(["conv2"], ["conv2", "shrink"]), feeds)


@pytest.mark.slow
def test_the_detectors_fast_candidates_are_the_whole_conversions():
    """On the detector: random sets of nodes out of int8 (its BatchNormalization in fp32), each fast candidate
    gives the bits of the candidate converted whole, on a rendered page."""
    import random

    from examples.text_pages import detector_pages

    model = onnx.load(need(DETECTOR))
    prepared = prepare_int8(model, opset=MIXED_OPSET)
    pages = list(detector_pages(2))
    options = QuantOptions()
    mixed = MixedQuantizer(make_quantizer(prepared, calibrate(prepared, pages, options), options))
    sited = sorted(mixed.quantizer.sites)
    whole = mixed._converted
    converted: List[tuple] = []
    mixed._converted = lambda kept, fp32: converted.append(tuple(kept)) or whole(kept, fp32)  # type: ignore[method-assign]
    rng = random.Random(0)
    for size in (1, 5, 20, 60):
        kept = rng.sample(sited, size)
        fast = mixed.convert(kept, ["p2o.BatchNormalization.1"])
        assert _same_outputs(fast, whole(kept, ["p2o.BatchNormalization.1"]), pages[0]), size
    # the first conv reads the fp32 graph input through an fp32 Q: out of int8, it reads it through a Cast
    kept = ["p2o.Conv.0", *rng.sample(sited, 10)]
    fast = mixed.convert(kept, ["p2o.BatchNormalization.1"])
    assert _same_outputs(fast, whole(kept, ["p2o.BatchNormalization.1"]), pages[0])
    assert converted == [()], "every set made from the one fully quantized model"
    # a node out of int8 and in fp32 is converted whole
    mixed.convert(["p2o.Conv.3"], ["p2o.Conv.3", "p2o.BatchNormalization.1"])
    assert converted[-1] == ("p2o.Conv.3",)
