"""Large graphs for the scale benchmark, built with onnx.helper: deep chains and a transformer-shaped model."""

from __future__ import annotations

from typing import List

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes: List[onnx.NodeProto], inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def chain(n: int, culprit: int, width: int = 64) -> onnx.ModelProto:
    """Add, Mul, Relu, Add, ... on a [1, width] tensor: ``n`` nodes named n0.., node ``culprit`` named "culprit"."""
    c = numpy_helper.from_array(np.full((1, width), 0.5, np.float32), "c")
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        op = ("Add", "Mul", "Relu")[i % 3]
        nodes.append(
            helper.make_node(
                op, [prev] if op == "Relu" else [prev, "c"], [out], name="culprit" if i == culprit else f"n{i}"
            )
        )
        prev = out
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, width]) for name in ("x", "y")]
    return _model(nodes, io[:1], io[1:], [c])


def transformer(layers: int, culprit_layer: int, seq: int = 16, dim: int = 64, heads: int = 4) -> onnx.ModelProto:
    """Pre-norm encoder blocks: LayerNorm, multi-head attention (MatMul, Reshape, Transpose, Softmax),
    a residual Add, LayerNorm and an MLP (MatMul, Relu, MatMul) with a residual Add. The Softmax of layer
    ``culprit_layer`` is named "culprit"; every node has a unique name.
    """
    rng = np.random.default_rng(0)
    head = dim // heads
    inits = [
        numpy_helper.from_array(np.ones(dim, np.float32), "ln_scale"),
        numpy_helper.from_array(np.zeros(dim, np.float32), "ln_bias"),
        numpy_helper.from_array(np.array([1, seq, heads, head], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([1, seq, dim], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(np.sqrt(head), np.float32), "scale"),
    ]
    nodes: List[onnx.NodeProto] = []
    x = "x"

    def node(op: str, ins: List[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [name], name=f"{name}_node", **attrs))
        return name

    for layer in range(layers):
        p = f"l{layer}_"
        for w in ("wq", "wk", "wv", "wo", "w1", "w2"):
            shape = (dim, 4 * dim) if w == "w1" else (4 * dim, dim) if w == "w2" else (dim, dim)
            inits.append(
                numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), p + w)
            )
        h = node("LayerNormalization", [x, "ln_scale", "ln_bias"], p + "ln1", axis=-1)
        q, k, v = (node("MatMul", [h, p + w], p + w[1]) for w in ("wq", "wk", "wv"))
        qh, kh, vh = (node("Reshape", [t, "split_shape"], t + "_split") for t in (q, k, v))
        qt = node("Transpose", [qh], p + "qt", perm=[0, 2, 1, 3])
        kt = node("Transpose", [kh], p + "kt", perm=[0, 2, 3, 1])
        vt = node("Transpose", [vh], p + "vt", perm=[0, 2, 1, 3])
        scores = node("Div", [node("MatMul", [qt, kt], p + "qk"), "scale"], p + "scores")
        probs = f"l{layer}_probs"
        nodes.append(
            helper.make_node(
                "Softmax", [scores], [probs], axis=-1, name="culprit" if layer == culprit_layer else p + "softmax"
            )
        )
        ctx = node("Transpose", [node("MatMul", [probs, vt], p + "ctx")], p + "ctx_t", perm=[0, 2, 1, 3])
        merged = node("Reshape", [ctx, "merge_shape"], p + "merged")
        x = node("Add", [x, node("MatMul", [merged, p + "wo"], p + "attn")], p + "res1")
        h2 = node("LayerNormalization", [x, "ln_scale", "ln_bias"], p + "ln2", axis=-1)
        mlp = node(
            "MatMul", [node("Relu", [node("MatMul", [h2, p + "w1"], p + "up")], p + "act"), p + "w2"], p + "down"
        )
        x = node("Add", [x, mlp], p + "res2")
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, seq, dim]) for name in ("x", "y")]
    return _model(nodes, io[:1], io[1:], inits)
