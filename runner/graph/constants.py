"""Constant nodes as initializers: the same tensors under the same names, fewer nodes."""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from runner.graph.isolate import outer_reads

#: a Constant node's numeric attributes other than ``value``, with the dtype ONNX gives each (its Constant spec)
_NUMERIC = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}


def is_tensor_constant(node: onnx.NodeProto) -> bool:
    """True for a Constant node holding a dense tensor: its ``value``, or a number or list of numbers
    (``value_float``, ``value_floats``, ``value_int``, ``value_ints``); False for sparse and string ones."""
    return node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name in ("value", *_NUMERIC)


def constant_tensor(node: onnx.NodeProto) -> Optional[TensorProto]:
    """The tensor a Constant node of ``is_tensor_constant`` makes, named as its output; None for another node."""
    if not is_tensor_constant(node):
        return None
    attribute = node.attribute[0]
    if attribute.name == "value":
        t = TensorProto()
        t.CopyFrom(attribute.t)
    else:
        t = numpy_helper.from_array(np.array(onnx.helper.get_attribute_value(attribute), _NUMERIC[attribute.name]))
    t.name = node.output[0]
    return t


def constants_to_initializers(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """Turn the top-level Constant nodes of dense tensors (``is_tensor_constant``: ``value``, and the numbers of
    ``value_float(s)``/``value_int(s)``) into initializers (tensor names kept).

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
        t = constant_tensor(node)
        if t is not None:
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


def fold_weight_identities(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """Remove top-level Identity nodes that forward an initializer: their readers read the
    initializer itself (torch.onnx forwards shared and tied weights this way).

    An Identity whose output is a graph output, or is read inside an If/Loop/Scan body, stays.
    Precision marking then never counts a weight's Identity as a node to keep, and a conversion
    never puts a Cast between a weight and its reader.

    Args:
        model: the model.
        in_place: modify ``model`` itself instead of a copy.

    Returns:
        The model (a copy unless ``in_place``).
    """
    out = model if in_place else _copy(model)
    g = out.graph
    inits = {i.name for i in g.initializer}
    outputs = {o.name for o in g.output}
    inner = outer_reads(g)
    forward = {
        n.output[0]: n.input[0]
        for n in g.node
        if n.op_type == "Identity" and n.input and n.input[0] in inits and n.output[0] not in outputs | inner
    }
    if not forward:
        return out
    keep = [n for n in g.node if not (n.op_type == "Identity" and n.output and n.output[0] in forward)]
    for node in keep:
        for i, name in enumerate(node.input):
            if name in forward:
                node.input[i] = forward[name]
    del g.node[:]
    g.node.extend(keep)
    dropped = set(forward)
    kept_vi = [v for v in g.value_info if v.name not in dropped]
    del g.value_info[:]
    g.value_info.extend(kept_vi)
    return out
