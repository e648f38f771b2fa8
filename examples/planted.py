"""Small models with planted faults, built with onnx.helper: a user's first targets for the tool, and
the graphs its tests and benchmarks run on.

- ``one_sensitive``, ``two_branches``, ``chain`` (``GRAPHS``): fp16 overflows; each returns (model, the nodes
  that must stay in fp32, the input scale that triggers the overflow).
- ``rmsnorm_decoder``: a Llama/Qwen2-style decoder whose first RMSNorm overflows fp16.
- ``attention_decoder``: a Qwen2-style decoder whose attention logits overflow fp16 in every layer.
- ``threshold_detector``: a detector whose outputs are decisions (a score threshold).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

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


def attention_decoder(
    layers: int = 4,
    dim: int = 128,
    heads: int = 8,
    vocab: int = 128,
    seq: int = 8,
    logit_peak: float = 1e6,
    seed: int = 0,
    update_gain: float = 1.0,
    overflowing: Optional[Sequence[int]] = None,
    casts: bool = False,
):
    """A Qwen2-style decoder whose attention logits overflow fp16 in every layer: the failure that
    made Stable Diffusion 2.x ship ``upcast_attention`` and GPT-2 XL ``reorder_and_upcast_attn``.

    Each block is torch.onnx's export of a Qwen2 layer: RMSNorm (Pow, ReduceMean, Add eps, Sqrt,
    Reciprocal, Mul, Mul weight), q/k/v projections with biases, heads split (Reshape, Transpose),
    rotary embedding on q and k (Slice, Slice, Neg, Concat, Mul cos, Mul sin, Add), the score MatMul,
    its scale Mul, the causal mask Add, Softmax, the MatMul with v, heads merged, the output
    projection, a residual Add, then RMSNorm, a gated SiLU MLP and a residual Add. Node names carry
    the block's scope (``layers.N.self_attn.q_proj``), as the TorchScript exporter's do.

    Every layer's q and k projections (those of the layers in ``overflowing``, when given) are scaled so
    that the largest raw score ``q.k`` is about ``logit_peak`` (1e6 by default: past fp16's 65504 before
    and after the 1/sqrt(head_dim) scale), so each such layer's score MatMul, scale Mul, mask Add and
    Softmax must stay in fp32. ``update_gain`` scales what the attention and the MLP add to the residual
    stream. With ``casts`` each RMSNorm casts its input to fp32 first and its normalized value back before the
    weight, as torch's export of ``Qwen2RMSNorm`` writes ``.to(torch.float32)`` and ``.to(input_dtype)``: two
    Casts of fp32 tensors to fp32 a norm, which the fp16 conversion drops or keeps by what is kept around them.

    How far the blocks amplify fp16 rounding depends on the shape: at the defaults (width 128, 8 heads of
    16, 8 tokens) keeping those 4 nodes a layer passes a relative L2 error of 0.05 on the logits at 4, 12
    and 24 layers; at width 64, 4 heads and 16 tokens the softmaxes are so sharp that rounding anywhere
    upstream flips a near tie from 12 layers on, and blocks of the first layers need fp32 too (the
    benchmark's "amplified" rows, ``benchmarks/depth.py``).

    Returns:
        (model, the nodes that must stay in fp32 (4 an overflowing layer), the int64 token ids to feed as ``ids``).
    """
    hot = set(range(layers)) if overflowing is None else set(overflowing)
    rng = np.random.default_rng(seed)
    head = dim // heads
    half = head // 2
    inv_freq = 1.0 / (10000 ** (np.arange(0, half) / half))
    angles = np.outer(np.arange(seq), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1)
    inits = [
        _const("emb", rng.standard_normal((vocab, dim))),
        _const("two", 2.0),
        _const("eps", 1e-6),
        _const("cos", np.cos(angles)[None, None]),
        _const("sin", np.sin(angles)[None, None]),
        _const("mask", mask[None, None]),
        _const("scale", 1.0 / np.sqrt(head)),
        numpy_helper.from_array(np.array([1, seq, heads, head], np.int64), "split_heads"),
        numpy_helper.from_array(np.array([1, seq, dim], np.int64), "merge_heads"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([half], np.int64), "half"),
        numpy_helper.from_array(np.array([head], np.int64), "head"),
        numpy_helper.from_array(np.array([3], np.int64), "last_axis"),
    ]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h0"], name="embed_tokens")]

    def node(op: str, inputs: List[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def rmsnorm(prefix: str, x: str) -> str:
        inits.append(_const(f"{prefix}.weight", 1 + 0.1 * rng.standard_normal(dim)))
        if casts:
            x = node("Cast", [x], f"{prefix}.cast", to=TensorProto.FLOAT)
        sq = node("Pow", [x, "two"], f"{prefix}.pow")
        mean = node("ReduceMean", [sq], f"{prefix}.mean", axes=[-1])
        inv = node(
            "Reciprocal",
            [node("Sqrt", [node("Add", [mean, "eps"], f"{prefix}.add_eps")], f"{prefix}.sqrt")],
            f"{prefix}.reciprocal",
        )
        normed = node("Mul", [x, inv], f"{prefix}.mul")
        if casts:
            normed = node("Cast", [normed], f"{prefix}.cast_back", to=TensorProto.FLOAT)
        return node("Mul", [normed, f"{prefix}.weight"], f"{prefix}.mul_weight")

    def linear(prefix: str, x: str, rows: int, cols: int, gain: float = 1.0, bias: bool = False) -> str:
        inits.append(_const(f"{prefix}.weight", gain * rng.standard_normal((rows, cols)) / np.sqrt(rows)))
        y = node("MatMul", [x, f"{prefix}.weight"], f"{prefix}.matmul")
        if bias:
            inits.append(_const(f"{prefix}.bias", 0.02 * rng.standard_normal(cols)))
            y = node("Add", [y, f"{prefix}.bias"], f"{prefix}.add_bias")
        return y

    def rotary(prefix: str, x: str) -> str:
        first = node("Slice", [x, "zero", "half", "last_axis"], f"{prefix}.slice_first")
        second = node("Slice", [x, "half", "head", "last_axis"], f"{prefix}.slice_second")
        turned = node("Concat", [node("Neg", [second], f"{prefix}.neg"), first], f"{prefix}.rotate_half", axis=-1)
        return node(
            "Add",
            [node("Mul", [x, "cos"], f"{prefix}.mul_cos"), node("Mul", [turned, "sin"], f"{prefix}.mul_sin")],
            f"{prefix}.add",
        )

    # q.k of unit-variance rows sums head products of about sqrt(head) spread: gain**2 * sqrt(head) * ~4 sigma
    gain = float(np.sqrt(logit_peak / (4 * np.sqrt(head))))
    h = "h0"
    for i in range(layers):
        p = f"layers.{i}"
        n = rmsnorm(f"{p}.input_layernorm", h)
        split = {}
        for name, g in (("q", gain if i in hot else 1.0), ("k", gain if i in hot else 1.0), ("v", 1.0)):
            y = linear(f"{p}.self_attn.{name}_proj", n, dim, dim, g, bias=True)
            y = node("Reshape", [y, "split_heads"], f"{p}.self_attn.{name}_split")
            split[name] = node("Transpose", [y], f"{p}.self_attn.{name}_heads", perm=[0, 2, 1, 3])
        q = rotary(f"{p}.self_attn.q_rotary", split["q"])
        k = rotary(f"{p}.self_attn.k_rotary", split["k"])
        kt = node("Transpose", [k], f"{p}.self_attn.k_transpose", perm=[0, 1, 3, 2])
        scores = node("MatMul", [q, kt], f"{p}.self_attn.scores")
        scaled = node("Mul", [scores, "scale"], f"{p}.self_attn.scale")
        masked = node("Add", [scaled, "mask"], f"{p}.self_attn.mask")
        probs = node("Softmax", [masked], f"{p}.self_attn.softmax", axis=-1)
        ctx = node("MatMul", [probs, split["v"]], f"{p}.self_attn.context")
        ctx = node("Transpose", [ctx], f"{p}.self_attn.merge_transpose", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "merge_heads"], f"{p}.self_attn.merge")
        h = node("Add", [h, linear(f"{p}.self_attn.o_proj", ctx, dim, dim, update_gain)], f"{p}.attn_residual")
        n = rmsnorm(f"{p}.post_attention_layernorm", h)
        gate = linear(f"{p}.mlp.gate_proj", n, dim, 2 * dim)
        silu = node("Mul", [gate, node("Sigmoid", [gate], f"{p}.mlp.sigmoid")], f"{p}.mlp.silu")
        act = node("Mul", [silu, linear(f"{p}.mlp.up_proj", n, dim, 2 * dim)], f"{p}.mlp.act")
        h = node("Add", [h, linear(f"{p}.mlp.down_proj", act, 2 * dim, dim, update_gain)], f"{p}.mlp_residual")
    logits = linear("lm_head", rmsnorm("norm", h), dim, vocab)
    nodes.append(helper.make_node("Identity", [logits], ["logits"], name="output"))
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])
    model = make_model(nodes, [ids], [f32("logits", [1, seq, vocab])], inits)
    needed = [f"layers.{i}.self_attn.{n}" for i in sorted(hot) for n in ("scores", "scale", "mask", "softmax")]
    return model, needed, rng.integers(0, vocab, (1, seq)).astype(np.int64)
