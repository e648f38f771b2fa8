"""Rewrite a reduced-precision model so that fp32 hardware reproduces fp16 (or bf16) storage.

ONNX Runtime on CPU silently computes in fp32 where it lacks fp16 kernels, so a model converted
to fp16 can hide an overflow. The rewrite makes every tensor that is fp16 in the model fp32, and
rounds each such node output through ``Cast(to=fp16) -> Cast(to=fp32)``: values past 65504
become Inf, tiny ones flush as fp16 would. Only tensors whose type is the low precision are
touched: integer, bool and shape tensors never are. Bodies of If/Loop/Scan are rewritten too.
"""

from __future__ import annotations

import logging
from typing import List, Tuple

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto

from runner.graph.meta import infer_shapes
from runner.graph.precisions import LOW_TYPES

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


def _onnx_type(dtype) -> int:
    if dtype is None:
        return TensorProto.UNDEFINED
    if isinstance(dtype, int):
        return dtype
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (TypeError, KeyError, ValueError):
        return TensorProto.UNDEFINED


def _widen_constant(const: gs.Constant) -> None:
    const.values = np.asarray(const.values, dtype=np.float32)


class _Rewriter:
    def __init__(self) -> None:
        self.lows = set(LOW_TYPES)
        self.rounded = 0
        self.n = 0

    def is_low(self, dtype) -> bool:
        return _onnx_type(dtype) in self.lows

    def rewrite(self, graph: gs.Graph) -> None:
        for tensor in graph.tensors().values():
            if isinstance(tensor, gs.Constant) and self.is_low(tensor.dtype):
                _widen_constant(tensor)
        for node in list(graph.nodes):
            self._rewrite_attrs(node)
            for sub in [v for v in node.attrs.values() if isinstance(v, gs.Graph)]:
                self.rewrite(sub)
            for i, out in enumerate(list(node.outputs)):
                if self.is_low(out.dtype):
                    self._round(graph, node, i, out)
        for t in list(graph.inputs) + list(graph.outputs):
            if self.is_low(t.dtype):
                t.dtype = np.float32
        graph.toposort()

    def _rewrite_attrs(self, node: gs.Node) -> None:
        if node.op == "Cast" and node.attrs.get("to") in self.lows:
            node.attrs["to"] = TensorProto.FLOAT
        if node.op in VALUE_ATTR_OPS:
            value = node.attrs.get("value")
            if isinstance(value, gs.Constant) and self.is_low(value.dtype):
                _widen_constant(value)
        if node.op in DTYPE_ATTR_OPS and node.attrs.get("dtype") in self.lows:
            node.attrs["dtype"] = TensorProto.FLOAT

    def _round(self, graph: gs.Graph, node: gs.Node, index: int, out: gs.Variable) -> None:
        self.n += 1
        to = _onnx_type(out.dtype)
        raw = gs.Variable(f"{out.name}__emu{self.n}_fp32", dtype=np.float32, shape=out.shape)
        low = gs.Variable(f"{out.name}__emu{self.n}_low", dtype=None, shape=out.shape)
        node.outputs[index] = raw
        out.dtype = np.float32
        graph.nodes.append(
            gs.Node("Cast", name=f"{out.name}__emu{self.n}_to_low", attrs={"to": to}, inputs=[raw], outputs=[low])
        )
        graph.nodes.append(
            gs.Node(
                "Cast",
                name=f"{out.name}__emu{self.n}_to_fp32",
                attrs={"to": TensorProto.FLOAT},
                inputs=[low],
                outputs=[out],
            )
        )
        self.rounded += 1


def emulate_low_precision(model: onnx.ModelProto) -> Tuple[onnx.ModelProto, List[str], List[str], int]:
    """Rewrite ``model`` so that it runs in fp32 with every fp16 or bf16 tensor rounded to its type.

    Args:
        model: a model holding float16 and/or bfloat16 tensors; not modified.

    Returns:
        (the rewritten model; names of graph inputs that were low precision (feed them as
        fp32); names of graph outputs that were (cast results back); number of tensors rounded).
    """
    try:
        typed = infer_shapes(model)
    except Exception as e:  # inference can fail on custom ops; types then come from value_info only
        log.warning("Type inference failed (%s); only tensors with declared types are rounded", str(e).splitlines()[0])
        typed = model
    logger = gs.logger.G_LOGGER
    before = logger.severity
    logger.severity = logger.ERROR  # it warns once per bf16 weight that numpy has no bf16 (widened here anyway)
    try:
        graph = gs.import_onnx(typed)
        rw = _Rewriter()
        low_inputs = [t.name for t in graph.inputs if rw.is_low(t.dtype)]
        low_outputs = [t.name for t in graph.outputs if rw.is_low(t.dtype)]
        rw.rewrite(graph)
        out = gs.export_onnx(graph, do_type_check=False)
    finally:
        logger.severity = before
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    return out, low_inputs, low_outputs, rw.rounded
