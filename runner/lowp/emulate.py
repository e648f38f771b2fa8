"""Rewrite a reduced-precision model so that fp32 hardware reproduces fp16 (or bf16) storage.

ONNX Runtime on CPU silently computes in fp32 where it lacks fp16 kernels, so a model converted
to fp16 can hide an overflow. The rewrite makes every tensor that is fp16 in the model fp32, and
rounds each such node output through ``Cast(to=fp16) -> Cast(to=fp32)``: values past 65504
become Inf, tiny ones flush as fp16 would. Only tensors whose type is the low precision are
touched: integer, bool and shape tensors never are. Bodies of If/Loop/Scan are rewritten too.

The rewrite works on the graph alone (``runner.graph.stubs``: weights as stubs, types from one
shape inference of that graph), then puts each weight back once, a low-precision one widened to
the fp32 values it stores: no weight is converted or copied more than once.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Set, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runner.errors import first_line
from runner.graph.stubs import fill, raw_bytes, weightless, widened
from runner.graph.weight_file import is_pointed, maps, weight_bytes, weight_file
from runner.lowp.precisions import LOW_TYPES

log = logging.getLogger(__name__)

DTYPE_ATTR_OPS = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "EyeLike",
    "Multinomial",
    "Bernoulli",
}
VALUE_ATTR_OPS = {"Constant", "ConstantOfShape"}


def _widen_tensor(tensor: TensorProto) -> None:
    """A low-precision tensor (weight, attribute value) in place as fp32 holding the same values."""
    values = numpy_helper.to_array(tensor).astype(np.float32)  # bf16 arrives as ml_dtypes' bfloat16
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))


class _Rewriter:
    """Rewrites one model's graphs in place; counts the tensors it rounds."""

    def __init__(self, types: Dict[str, int]):
        self.types = types
        self.rounded = 0

    def rewrite(self, graph: onnx.GraphProto) -> None:
        for init in graph.initializer:
            if init.data_type in LOW_TYPES:
                _widen_tensor(init)
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.elem_type in LOW_TYPES:
                tt.elem_type = TensorProto.FLOAT
        nodes: List[onnx.NodeProto] = []
        for node in graph.node:
            self._rewrite_attrs(node)
            nodes.append(node)
            for k, out in enumerate(node.output):
                if out and self.types.get(out) in LOW_TYPES:
                    nodes.extend(self._round(node, k, out))
        del graph.node[:]
        graph.node.extend(nodes)

    def _rewrite_attrs(self, node: onnx.NodeProto) -> None:
        for attr in node.attribute:
            retyped = (node.op_type == "Cast" and attr.name == "to") or (
                node.op_type in DTYPE_ATTR_OPS and attr.name == "dtype"
            )
            if retyped and attr.i in LOW_TYPES:
                attr.i = TensorProto.FLOAT
            elif node.op_type in VALUE_ATTR_OPS and attr.name == "value" and attr.t.data_type in LOW_TYPES:
                _widen_tensor(attr.t)
            if attr.type == onnx.AttributeProto.GRAPH:
                self.rewrite(attr.g)
            for sub in attr.graphs:
                self.rewrite(sub)

    def _round(self, node: onnx.NodeProto, index: int, out: str) -> List[onnx.NodeProto]:
        """``node``'s output ``index`` renamed, and the Casts that round it back into ``out``."""
        self.rounded += 1
        n, to = self.rounded, self.types[out]
        raw, low = f"{out}__emu{n}_fp32", f"{out}__emu{n}_low"
        node.output[index] = raw
        return [
            helper.make_node("Cast", [raw], [low], name=f"{out}__emu{n}_to_low", to=to),
            helper.make_node("Cast", [low], [out], name=f"{out}__emu{n}_to_fp32", to=TensorProto.FLOAT),
        ]


def tensor_types(typed: onnx.ModelProto) -> Dict[str, int]:
    """Every tensor's element type in ``typed`` (inferred value_info, inputs, outputs, initializers,
    node outputs of Constant nodes and Casts), bodies included."""
    types: Dict[str, int] = {}
    graphs = [typed.graph]
    while graphs:
        g = graphs.pop()
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types.setdefault(vi.name, vi.type.tensor_type.elem_type)
        for init in g.initializer:
            types.setdefault(init.name, init.data_type)
        for node in g.node:
            for attr in node.attribute:
                if node.op_type == "Cast" and attr.name == "to" and node.output:
                    types.setdefault(node.output[0], attr.i)
                if attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)
    return types


def emulate_low_precision(model: onnx.ModelProto) -> Tuple[onnx.ModelProto, List[str], List[str], int]:
    """Rewrite ``model`` so that it runs in fp32 with every fp16 or bf16 tensor rounded to its type.

    Args:
        model: a model holding float16 and/or bfloat16 tensors; not modified.

    Returns:
        (the rewritten model; names of graph inputs that were low precision (feed them as
        fp32); names of graph outputs that were (cast results back); number of tensors rounded).
    """
    bare, weights = weightless(model)
    try:
        typed = onnx.shape_inference.infer_shapes(bare, strict_mode=False, data_prop=True)
    except Exception as e:  # inference can fail on custom ops; types then come from what is declared
        log.warning("Type inference failed (%s); only tensors with declared types are rounded", first_line(e))
        typed = bare
    types = tensor_types(typed)
    g = typed.graph
    low_inputs = [i.name for i in g.input if i.type.tensor_type.elem_type in LOW_TYPES]
    low_outputs = [o.name for o in g.output if o.type.tensor_type.elem_type in LOW_TYPES]
    stubs: Set[str] = set(weights)
    low_stubs = {i.name for i in g.initializer if i.name in stubs and i.data_type in LOW_TYPES}
    # weights already in the weight file (a large model's marked copy) stay there, stored as they are
    stored = {i.name: i.data_type for i in g.initializer if i.data_type in LOW_TYPES and is_pointed(i)}
    mapping = bool(stored) or maps(weight_bytes(model))
    for init in g.initializer:
        if init.name in low_stubs or init.name in stored:
            init.data_type = TensorProto.FLOAT
    rw = _Rewriter(types)
    rw.rewrite(g)
    del g.value_info[:]  # inferred here; the session infers again, and the Casts renamed what some describe
    if mapping:  # what the weight file cannot take (a full disk) is filled below, widened
        pointed = _point(typed, weights)
        stored.update({name: weights[name].data_type for name in low_stubs & pointed})
        _cast_stored(g, stored)

    def values(stub: TensorProto) -> bytes:
        source = weights[stub.name]
        if stub.name in low_stubs:
            return widened(source, raw_bytes(source))
        return raw_bytes(source)

    fill(typed, values, stubs)
    return typed, low_inputs, low_outputs, rw.rounded


def _cast_stored(g: onnx.GraphProto, stored: Dict[str, int]) -> None:
    """Keep the low-precision weights named in ``stored`` (name: their type) stored in that type under
    a new name, with a ``Cast`` to fp32 (exact) just before their first reader giving the old name:
    no fp32 copy of them is made."""
    casts: Dict[str, onnx.NodeProto] = {}
    for init in g.initializer:
        if init.name in stored:
            new = f"{init.name}__emu_stored"
            casts[init.name] = helper.make_node("Cast", [new], [init.name], name=new + "_to_fp32", to=TensorProto.FLOAT)
            init.name, init.data_type = new, stored[init.name]
    if casts:
        nodes: List[onnx.NodeProto] = []
        for node in g.node:
            nodes.extend(casts.pop(name) for name in _reads(node) if name in casts)
            nodes.append(node)
        del g.node[:]
        g.node.extend(list(casts.values()) + nodes)  # a weight read only in a body: its Cast goes first


def _point(typed: onnx.ModelProto, weights: Dict[str, TensorProto]) -> Set[str]:
    """Point ``typed``'s stubs (``weights``: stub name: the tensor holding its values) into the weight
    file, in place, until the file cannot be written; the names pointed."""
    file = weight_file()
    pointed: Set[str] = set()
    for init in typed.graph.initializer:
        if init.name in weights:
            if not file.point(init, weights[init.name]):
                break
            pointed.add(init.name)
    return pointed


def _reads(node: onnx.NodeProto) -> List[str]:
    """The tensors ``node`` reads: its inputs, then the outer-scope names its bodies read."""
    names = [n for n in node.input if n]
    stack = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    stack += [g for a in node.attribute for g in a.graphs]
    while stack:
        body = stack.pop()
        for inner in body.node:
            names.extend(n for n in inner.input if n)
            stack.extend(a.g for a in inner.attribute if a.type == onnx.AttributeProto.GRAPH)
            stack.extend(g for a in inner.attribute for g in a.graphs)
    return names
