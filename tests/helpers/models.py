"""Models for tests: the real ones (../shared/models, else the copies bundled in examples/), and small
graphs built with onnx.helper."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from examples.planted import f32, make_model

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("RUNNER_SHARED_MODELS", ROOT.parent / "shared" / "models"))
EXAMPLES = ROOT / "examples"


def real_model(name: str) -> Path:
    """A real model by file name: from the shared models, else the bundled copy in examples/."""
    shared = MODELS / name
    return shared if shared.is_file() or not (EXAMPLES / name).is_file() else EXAMPLES / name


DETECTOR = real_model("ch_PP-OCRv4_det_infer.onnx")
CLASSIFIER = real_model("ch_ppocr_mobile_v2.0_cls_infer.onnx")
VAD = real_model("silero_vad_16k_op15.onnx")
VAD_IF = real_model("silero_vad.onnx")


def need(path: Path) -> Path:
    """Skip (with the reason) when a real model is neither beside the checkout nor bundled."""
    if not path.is_file():
        pytest.skip(f"{path} not found: put ../shared/models beside the checkout or set RUNNER_SHARED_MODELS")
    return path


def sha256(path: Path) -> str:
    """The file's sha256, hex."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def perturbed_classifier(scale: float = 1.5) -> Tuple[onnx.ModelProto, str]:
    """The bundled classifier with its 34th Conv's weight (a Constant node's value) scaled by ``scale``: a
    weight gone wrong that reduce against the original's golden values finds alone. Returns the model and
    that Conv's name."""
    from onnx import numpy_helper

    model = onnx.load(str(need(CLASSIFIER)))
    producer = {o: n for n in model.graph.node for o in n.output}
    conv = [n for n in model.graph.node if n.op_type == "Conv"][33]
    weight = next(a for a in producer[conv.input[1]].attribute if a.name == "value").t
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(scale), weight.name))
    return model, conv.name


def chain_model(n: int, shape=(1, 4)) -> onnx.ModelProto:
    """x -> Relu -> Add(const) -> Relu -> ... : ``n`` compute nodes named n0..n{n-1}, plus a Constant."""
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["c"],
            name="const",
            value=helper.make_tensor("cv", TensorProto.FLOAT, list(shape), np.ones(shape, np.float32).ravel()),
        )
    ]
    prev = "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        if i % 2:
            nodes.append(helper.make_node("Add", [prev, "c"], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node("Relu", [prev], [out], name=f"n{i}"))
        prev = out
    return make_model(nodes, [f32("x", list(shape))], [f32("y", list(shape))])


def branchy_model() -> onnx.ModelProto:
    """Two branches of three nodes each (a0..a2, b0..b2) joined by an Add, with two graph outputs."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 4], np.full(4, 0.5, np.float32))
    nodes = [
        helper.make_node("Relu", ["x"], ["a0o"], name="a0"),
        helper.make_node("Mul", ["a0o", "w"], ["a1o"], name="a1"),
        helper.make_node("Sigmoid", ["a1o"], ["a2o"], name="a2"),
        helper.make_node("Neg", ["x"], ["b0o"], name="b0"),
        helper.make_node("Abs", ["b0o"], ["b1o"], name="b1"),
        helper.make_node("Tanh", ["b1o"], ["b2o"], name="b2"),
        helper.make_node("Add", ["a2o", "b2o"], ["sum"], name="join"),
        helper.make_node("Identity", ["b2o"], ["side"], name="side_out"),
    ]
    return make_model(nodes, [f32("x", [1, 4])], [f32("sum", [1, 4]), f32("side", [1, 4])], [w])


def overflow_model() -> onnx.ModelProto:
    """x [1, 4] -> Relu "pre" -> Mul(300) "scale" -> Mul(0.001) "shrink" -> Relu "act" -> y, in fp32. In fp16,
    "scale" overflows (past 65504) once x exceeds 218, and only then."""
    consts = [
        helper.make_tensor("k300", TensorProto.FLOAT, [], [300.0]),
        helper.make_tensor("k001", TensorProto.FLOAT, [], [0.001]),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["pos"], name="pre"),
        helper.make_node("Mul", ["pos", "k300"], ["big"], name="scale"),
        helper.make_node("Mul", ["big", "k001"], ["small"], name="shrink"),
        helper.make_node("Relu", ["small"], ["y"], name="act"),
    ]
    return make_model(nodes, [f32("x", [1, 4])], [f32("y", [1, 4])], consts)


def graph_index(model: onnx.ModelProto, shapes=None, keep_constant_nodes: bool = False):
    """A ``runner.graph.subgraph.GraphIndex`` of ``model``, with tensor shapes from ``shapes`` or a run."""
    from runner.graph.feeds import model_feeds
    from runner.graph.meta import TensorMeta
    from runner.graph.subgraph import GraphIndex
    from runner.graph.summaries import tensor_summaries

    meta = TensorMeta(model, shapes or {}, lambda: tensor_summaries(model, model_feeds(model, shapes, None, 0), 2**30))
    return GraphIndex(model, meta, keep_constant_nodes=keep_constant_nodes)


def unstable_decoder(layers: int = 8, width: int = 64, tokens: int = 32) -> onnx.ModelProto:
    """A decoder unstable in fp32 itself: its residual stream sits on an offset of 1,000 (so ONNX Runtime's fused
    LayerNormalization, level ``all``, and the decomposed one, level ``disable``, differ in their last bits) and
    its attention logits are about 1e5 (scaled by 10, plus a constant bias of 1e5 as a mask would add), so those
    bits move the attention. The output takes the offset off again. Between the two optimization levels its
    output moves by about 8% rel L2 (ONNX Runtime 1.2x on x86-64). Input ``x`` [1, tokens, width]."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(a, np.float32), n)
        for a, n in ((2.0, "two"), (1e-5, "eps"), (np.full(width, 1e3), "off"), (10.0, "scale"), (1e5, "mask"))
    ]
    nodes = [helper.make_node("Add", ["x", "off"], ["x0"], name="embed")]
    x = "x0"
    for i in range(layers):
        gain = (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)
        shift = (0.1 * rng.standard_normal(width)).astype(np.float32)
        inits += [numpy_helper.from_array(gain, f"g{i}"), numpy_helper.from_array(shift, f"b{i}")]
        nodes += [
            helper.make_node("ReduceMean", [x], [f"mu{i}"], axes=[-1], keepdims=1, name=f"mean{i}"),
            helper.make_node("Sub", [x, f"mu{i}"], [f"c{i}"], name=f"center{i}"),
            helper.make_node("Pow", [f"c{i}", "two"], [f"p{i}"], name=f"pow{i}"),
            helper.make_node("ReduceMean", [f"p{i}"], [f"var{i}"], axes=[-1], keepdims=1, name=f"variance{i}"),
            helper.make_node("Add", [f"var{i}", "eps"], [f"ve{i}"], name=f"addeps{i}"),
            helper.make_node("Sqrt", [f"ve{i}"], [f"sd{i}"], name=f"sqrt{i}"),
            helper.make_node("Div", [f"c{i}", f"sd{i}"], [f"n{i}"], name=f"div{i}"),
            helper.make_node("Mul", [f"n{i}", f"g{i}"], [f"ng{i}"], name=f"gain{i}"),
            helper.make_node("Add", [f"ng{i}", f"b{i}"], [f"h{i}"], name=f"shift{i}"),
        ]
        for w in "qkv":
            weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
            inits.append(numpy_helper.from_array(weight, f"W{w}{i}"))
            nodes.append(helper.make_node("MatMul", [f"h{i}", f"W{w}{i}"], [f"{w}{i}"], name=f"{w}proj{i}"))
        out = f"x{i + 1}"
        nodes += [
            helper.make_node("Transpose", [f"k{i}"], [f"kt{i}"], perm=[0, 2, 1], name=f"kt{i}"),
            helper.make_node("MatMul", [f"q{i}", f"kt{i}"], [f"s{i}"], name=f"qk{i}"),
            helper.make_node("Mul", [f"s{i}", "scale"], [f"ss{i}"], name=f"scale{i}"),
            helper.make_node("Add", [f"ss{i}", "mask"], [f"sm{i}"], name=f"mask{i}"),
            helper.make_node("Softmax", [f"sm{i}"], [f"a{i}"], axis=-1, name=f"softmax{i}"),
            helper.make_node("MatMul", [f"a{i}", f"v{i}"], [f"o{i}"], name=f"av{i}"),
            helper.make_node("Add", [x, f"o{i}"], [out], name=f"res{i}"),
        ]
        x = out
    nodes.append(helper.make_node("Sub", [x, "off"], ["y"], name="unembed"))
    return make_model(nodes, [f32("x", [1, tokens, width])], [f32("y", [1, tokens, width])], inits)


def unstable_detector(keep: int = 3) -> onnx.ModelProto:
    """A detector whose fp32 boxes move between ONNX Runtime's optimization levels, as a near-tied SSD's do: the
    ``unstable_decoder`` scores 32 disjoint boxes (the sigmoid of each token's first feature) and NMS keeps the
    ``keep`` best. Outputs ``det_boxes`` [k, 4] and ``det_scores`` [k], for ``checker.detections``."""
    from onnx import numpy_helper

    model = unstable_decoder()
    graph = model.graph
    tokens = graph.input[0].type.tensor_type.shape.dim[1].dim_value
    boxes = np.array([[20.0 * i, 0.0, 20.0 * i + 10.0, 10.0] for i in range(tokens)], np.float32)
    graph.initializer.extend(
        numpy_helper.from_array(np.asarray(a), n)
        for a, n in (
            (boxes[None], "boxes"), (boxes, "boxes0"), (np.array([keep], np.int64), "max_out"),
            (np.array([0.5], np.float32), "iou"), (np.array([-1.0], np.float32), "min_score"),
            (np.array(0, np.int64), "feature"), (np.array([0], np.int64), "first"), (np.array([2], np.int64), "col"),
            (np.array([3], np.int64), "col_end"), (np.array([1], np.int64), "col_axis"),
        )
    )  # fmt: skip
    graph.node.extend(
        [
            helper.make_node("Gather", ["y", "feature"], ["feature0"], axis=2, name="pick"),
            helper.make_node("Sigmoid", ["feature0"], ["token_scores"], name="score"),
            helper.make_node("Unsqueeze", ["token_scores", "first"], ["scores"], name="classes"),
            helper.make_node(
                "NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "min_score"], ["sel"], name="nms"
            ),
            helper.make_node("Slice", ["sel", "col", "col_end", "col_axis"], ["picked"], name="box_index"),
            helper.make_node("Squeeze", ["picked", "col_axis"], ["index"], name="flat"),
            helper.make_node("Gather", ["boxes0", "index"], ["det_boxes"], axis=0, name="det_boxes"),
            helper.make_node("Squeeze", ["token_scores", "first"], ["flat_scores"], name="flat_scores"),
            helper.make_node("Gather", ["flat_scores", "index"], ["det_scores"], axis=0, name="det_scores"),
        ]
    )
    del graph.output[:]
    graph.output.extend([f32("det_boxes", ["k", 4]), f32("det_scores", ["k"])])
    onnx.checker.check_model(model)
    return model
