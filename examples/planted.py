"""Small models with planted faults, built with onnx.helper: a user's first targets for the tool, and
the graphs its tests and benchmarks run on.

- ``one_sensitive``, ``two_branches``, ``chain`` (``GRAPHS``): fp16 overflows; each returns (model, the nodes
  that must stay in fp32, the input scale that triggers the overflow).
- ``rmsnorm_decoder``: a Llama/Qwen2-style decoder whose first RMSNorm overflows fp16.
- ``threshold_detector``: a detector whose outputs are decisions (a score threshold).
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    opset: int = 17,
) -> onnx.ModelProto:
    """A model of one graph from nodes and value infos, opset ``opset``, IR version 8.

    Raises:
        onnx.checker.ValidationError: the graph is not valid ONNX.
    """
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def f32(name: str, shape: List) -> onnx.ValueInfoProto:
    """A float32 tensor value info of ``shape`` (ints or dimension names)."""
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _const(name, value):
    return numpy_helper.from_array(np.array(value, np.float32), name)


def one_sensitive():
    """Mul by 1e5 (past fp16's 65504) on small inputs: only that node's weight needs fp32."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Abs", ["a"], ["b"], name="abs0"),
        helper.make_node("Mul", ["b", "C"], ["c"], name="big_mul"),
        helper.make_node("Relu", ["c"], ["d"], name="relu1"),
        helper.make_node("Neg", ["d"], ["e"], name="neg"),
        helper.make_node("Abs", ["e"], ["y"], name="abs1"),
    ]
    return make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [_const("C", 1e5)]), ["big_mul"], 1e-3


def two_branches():
    """Two Muls by constants past fp16's range on different branches, joined by an Add."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Mul", ["a", "CA"], ["pa"], name="mul_a"),
        helper.make_node("Relu", ["pa"], ["qa"], name="relu_a"),
        helper.make_node("Mul", ["a", "CB"], ["pb"], name="mul_b"),
        helper.make_node("Abs", ["pb"], ["qb"], name="abs_b"),
        helper.make_node("Add", ["qa", "qb"], ["s"], name="join"),
        helper.make_node("Relu", ["s"], ["y"], name="relu_out"),
    ]
    return (
        make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [_const("CA", 1e5), _const("CB", 2e5)]),
        ["mul_a", "mul_b"],
        1e-3,
    )


def chain():
    """x^2 overflows fp16 for x ~ 300 and the Sqrt after it must read it in fp32: both stay together."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Abs", ["a"], ["b"], name="abs0"),
        helper.make_node("Pow", ["b", "two"], ["p"], name="square"),
        helper.make_node("Sqrt", ["p"], ["r"], name="root"),
        helper.make_node("Relu", ["r"], ["s"], name="relu1"),
        helper.make_node("Neg", ["s"], ["y"], name="neg"),
    ]
    return make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [_const("two", 2.0)]), ["square", "root"], 300.0


GRAPHS = {"one_sensitive": one_sensitive, "two_branches": two_branches, "chain": chain}


def rmsnorm_decoder(layers: int = 4, dim: int = 32, vocab: int = 64, seq: int = 8, scale: float = 600.0, seed: int = 0):
    """A Llama/Qwen2-style decoder (torch.onnx's RMSNorm: Pow, ReduceMean, Add eps, Sqrt, Reciprocal,
    Mul, Mul weight; gated SiLU MLPs with residual Adds) whose token embeddings are scaled by
    ``scale``: the first RMSNorm's x*x passes fp16's 65504 (x ~ 600), and its Pow, ReduceMean, Add
    and Sqrt must stay in fp32; the blocks after it read normalized, small values.

    Returns:
        (model, the nodes that must stay in fp32, the int64 token ids to feed as ``ids``).
    """
    rng = np.random.default_rng(seed)
    inits = [
        _const("emb", scale * rng.standard_normal((vocab, dim))),
        _const("two", 2.0),
        _const("eps", 1e-6),
        _const("one", 1.0),
    ]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h0"], name="embed")]

    def rmsnorm(prefix: str, x: str) -> str:
        inits.append(_const(f"{prefix}.w", 1 + 0.1 * rng.standard_normal(dim)))
        nodes.extend(
            [
                helper.make_node("Pow", [x, "two"], [f"{prefix}.sq"], name=f"{prefix}.pow"),
                helper.make_node("ReduceMean", [f"{prefix}.sq"], [f"{prefix}.ms"], name=f"{prefix}.mean", axes=[-1]),
                helper.make_node("Add", [f"{prefix}.ms", "eps"], [f"{prefix}.mse"], name=f"{prefix}.add_eps"),
                helper.make_node("Sqrt", [f"{prefix}.mse"], [f"{prefix}.rms"], name=f"{prefix}.sqrt"),
                helper.make_node("Reciprocal", [f"{prefix}.rms"], [f"{prefix}.inv"], name=f"{prefix}.reciprocal"),
                helper.make_node("Mul", [x, f"{prefix}.inv"], [f"{prefix}.n"], name=f"{prefix}.mul"),
                helper.make_node("Mul", [f"{prefix}.n", f"{prefix}.w"], [f"{prefix}.out"], name=f"{prefix}.mul_w"),
            ]
        )
        return f"{prefix}.out"

    def matmul(prefix: str, x: str, rows: int, cols: int) -> str:
        inits.append(_const(f"{prefix}.W", rng.standard_normal((rows, cols)) / np.sqrt(rows)))
        nodes.append(helper.make_node("MatMul", [x, f"{prefix}.W"], [f"{prefix}.y"], name=f"{prefix}.matmul"))
        return f"{prefix}.y"

    h = matmul("proj_in", rmsnorm("norm_in", "h0"), dim, dim)
    for i in range(layers):
        p = f"layers.{i}"
        n = rmsnorm(f"{p}.norm", h)
        gate, up = matmul(f"{p}.gate", n, dim, 2 * dim), matmul(f"{p}.up", n, dim, 2 * dim)
        nodes += [
            helper.make_node("Sigmoid", [gate], [f"{p}.sig"], name=f"{p}.sigmoid"),
            helper.make_node("Mul", [gate, f"{p}.sig"], [f"{p}.silu"], name=f"{p}.silu"),
            helper.make_node("Mul", [f"{p}.silu", up], [f"{p}.act"], name=f"{p}.act"),
        ]
        down = matmul(f"{p}.down", f"{p}.act", 2 * dim, dim)
        nodes.append(helper.make_node("Add", [h, down], [f"{p}.res"], name=f"{p}.residual"))
        h = f"{p}.res"
    logits = matmul("lm_head", rmsnorm("norm_out", h), dim, vocab)
    nodes.append(helper.make_node("Identity", [logits], ["logits"], name="output"))
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])
    model = make_model(nodes, [ids], [f32("logits", [1, seq, vocab])], inits)
    needed = ["norm_in.pow", "norm_in.mean", "norm_in.add_eps", "norm_in.sqrt"]
    return model, needed, rng.integers(0, vocab, (1, seq)).astype(np.int64)


def threshold_detector(threshold: float = 0.5, seed: int = 0):
    """A tiny detector whose outputs are decisions: a 1x1 Conv makes 64 anchors' box offsets and score
    logits, Sigmoid scores them, and a score threshold (Greater, NonZero, GatherND, as torchvision's
    postprocessing exports) keeps the boxes and scores above ``threshold``: how many rows ``boxes`` and
    ``scores`` have depends on the data.

    Returns:
        (model, its input ``x`` [1, 3, 8, 8]).
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((5, 3, 1, 1)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array([64, 5], np.int64), "rows"),
        numpy_helper.from_array(np.array([0], np.int64), "c0"),
        numpy_helper.from_array(np.array([2], np.int64), "c2"),
        numpy_helper.from_array(np.array([4], np.int64), "c4"),
        numpy_helper.from_array(np.array([5], np.int64), "c5"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        _const("threshold", threshold),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["raw"], name="head"),
        helper.make_node("Transpose", ["raw"], ["raw_t"], name="to_rows", perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["raw_t", "rows"], ["anchors"], name="anchors"),
        helper.make_node("Slice", ["anchors", "c0", "c2", "axis1"], ["corner"], name="corner"),
        helper.make_node("Slice", ["anchors", "c2", "c4", "axis1"], ["size_raw"], name="size_raw"),
        helper.make_node("Abs", ["size_raw"], ["size"], name="size"),
        helper.make_node("Add", ["corner", "size"], ["far"], name="far"),
        helper.make_node("Concat", ["corner", "far"], ["decoded"], name="decode", axis=1),
        helper.make_node("Slice", ["anchors", "c4", "c5", "axis1"], ["logit2d"], name="logit"),
        helper.make_node("Squeeze", ["logit2d", "axis1"], ["logits"], name="logits"),
        helper.make_node("Sigmoid", ["logits"], ["all_scores"], name="score"),
        helper.make_node("Greater", ["all_scores", "threshold"], ["keep"], name="threshold"),
        helper.make_node("NonZero", ["keep"], ["kept"], name="nonzero"),
        helper.make_node("Transpose", ["kept"], ["kept_t"], name="kept_rows", perm=[1, 0]),
        helper.make_node("GatherND", ["decoded", "kept_t"], ["boxes"], name="pick_boxes"),
        helper.make_node("GatherND", ["all_scores", "kept_t"], ["scores"], name="pick_scores"),
    ]
    outputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["k", 4])]
    outputs.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["k"]))
    model = make_model(nodes, [f32("x", [1, 3, 8, 8])], outputs, inits)
    return model, rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
