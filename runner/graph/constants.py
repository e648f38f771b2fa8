"""Constant nodes as initializers: the same tensors under the same names, fewer nodes."""

from __future__ import annotations

import onnx
from onnx import TensorProto


def is_tensor_constant(node: onnx.NodeProto) -> bool:
    """True for a Constant node holding a tensor (``value``) attribute."""
    return node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value"


def constants_to_initializers(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """Turn the top-level tensor-valued Constant nodes into initializers (tensor names kept).

    Args:
        model: the model.
        in_place: modify ``model`` itself instead of a copy.

    Returns:
        The model (a copy unless ``in_place``).
    """
    if not any(is_tensor_constant(n) for n in model.graph.node):
        return model if in_place else _copy(model)
    out = model
    if not in_place:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    g = out.graph
    keep = []
    for node in g.node:
        if is_tensor_constant(node):
            t = TensorProto()
            t.CopyFrom(node.attribute[0].t)
            t.name = node.output[0]
            g.initializer.append(t)
        else:
            keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    return out


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
