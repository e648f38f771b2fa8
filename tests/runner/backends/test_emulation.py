"""fp16/bf16 emulation on fp16-converted real models: type-aware rounding that exposes overflows."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runner.backends.base import make_backend
from runner.graph.constants import constants_to_initializers
from runner.graph.feeds import model_feeds
from runner.lowp.convert import convert_except, name_nodes
from runner.lowp.emulate import emulate_low_precision
from tests.helpers.models import CLASSIFIER, DETECTOR, VAD_IF, need


def _fp16(path):
    model = constants_to_initializers(name_nodes(onnx.load(str(need(path)))))
    return model, convert_except(model, [])


def test_classifier_fp16_runs_and_int_tensors_are_untouched():
    fp32, fp16 = _fp16(CLASSIFIER)
    feeds = model_feeds(fp32, {"x": [1, 3, 48, 192]}, None, 0)
    ref = make_backend("onnxruntime").run(fp32, feeds)
    got = make_backend("fp16_emulation").run(fp16, feeds)
    name = fp32.graph.output[0].name
    assert np.isfinite(got[name]).all()
    assert np.abs(got[name].astype(np.float32) - ref[name]).max() < 0.05
    rewritten, _, _, rounded = emulate_low_precision(fp16)
    casts = [n for n in rewritten.graph.node if n.op_type == "Cast" and n.name.endswith("_to_low")]
    assert rounded == len(casts) > 100
    typed = onnx.shape_inference.infer_shapes(fp16)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in typed.graph.value_info}
    rounded_tensors = {n.input[0].split("__emu")[0] for n in casts}
    assert rounded_tensors <= set(types), "every rounded tensor has an inferred type"
    assert all(types[t] == TensorProto.FLOAT16 for t in rounded_tensors), "only fp16 tensors are rounded"
    int_tensors = {t for t, ty in types.items() if ty in (TensorProto.INT64, TensorProto.INT32)}
    assert int_tensors and not (int_tensors & rounded_tensors), "the Shape/Slice/Concat int tensors are never cast"


def test_detector_fp16_overflow_shows_only_under_emulation():
    fp32, fp16 = _fp16(DETECTOR)
    feeds = {"x": (np.random.default_rng(0).random((1, 3, 96, 96)) * 255).astype(np.float32)}
    out = fp32.graph.output[0].name
    ref = make_backend("onnxruntime").run(fp32, feeds)[out]
    emu = make_backend("fp16_emulation").run(fp16, feeds)[out].astype(np.float32)
    assert np.abs(emu - ref).max() > 0.5, "fp16 storage breaks the detector on unnormalised pixels"


def test_if_subgraphs_are_converted_and_emulated():
    fp32, fp16 = _fp16(VAD_IF)
    feeds = {
        "input": np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    ref = make_backend("onnxruntime").run(fp32, feeds)
    got = make_backend("fp16_emulation").run(fp16, feeds)
    assert set(got) == set(ref)
    for name in ref:
        assert np.isfinite(got[name]).all()
        assert np.abs(got[name].astype(np.float32) - ref[name]).max() < 0.05
    rewritten, _, _, _rounded = emulate_low_precision(fp16)
    bodies = [
        a.g
        for n in rewritten.graph.node
        if n.op_type == "If"
        for a in n.attribute
        if a.type == onnx.AttributeProto.GRAPH
    ]
    assert bodies and any(m.op_type == "Cast" and m.name.endswith("_to_low") for b in bodies for m in b.node), (
        "If bodies are rounded too"
    )


def test_bf16_rounding_loses_precision_but_not_range():
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"], name="mul")]
    k = helper.make_tensor("k", TensorProto.BFLOAT16, [], [1.0])
    g = helper.make_graph(
        nodes,
        "bf",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])],
        [k],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([1e20, 1 + 2**-9, 3.0], np.float32)
    got = make_backend("bf16_emulation").run(model, {"x": x})["y"]
    assert got[0] == pytest.approx(1e20, rel=1e-2) and np.isfinite(got[0]), "bf16 has fp32's range"
    assert got[1] == 1.0, "bf16 keeps 8 significant bits"
    assert got[2] == 3.0


def test_emulation_holds_as_many_rewritten_models_as_it_is_asked_to_keep():
    """One rewritten model by default (the next key replaces it); ``keep(3)``: three cycled keys are each
    rewritten once, a fourth pushes out the oldest."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    backend = make_backend("fp16_emulation")
    first = backend.prepare(model, "a")
    backend.prepare(model, "b")
    assert backend.prepare(model, "a") is not first, "one kept: a was rewritten again"
    backend.keep(3)
    kept = {k: backend.prepare(model, k) for k in "abc"}
    assert all(backend.prepare(model, k) is kept[k] for k in "abcabc")
    backend.prepare(model, "d")
    assert backend.prepare(model, "a") is not kept["a"] and backend.prepare(model, "d") is not None
    assert backend.prepare(model, "c") is kept["c"]
