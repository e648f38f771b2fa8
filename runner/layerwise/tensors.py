"""Tensor helpers of the layerwise comparison: types, weights, marked outputs, and matching a
target's tensors to the reference's through a conversion's Casts."""

from __future__ import annotations

import logging
from typing import Any, Dict, Set, Tuple

import numpy as np
import onnx

from runner.errors import first_line
from runner.graph.feeds import as_declared
from runner.graph.meta import infer_shapes
from runner.graph.stubs import weightless
from runner.lowp.precisions import FLOAT16

log = logging.getLogger(__name__)


FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def weight_peaks(model: onnx.ModelProto) -> Dict[str, float]:
    """``{node name: largest finite |value| among its float weights}`` (initializers and Constant
    node outputs it reads), for nodes with any."""
    from onnx import numpy_helper

    values: Dict[str, float] = {}
    for init in model.graph.initializer:
        if init.data_type in FLOAT_TYPES:
            values[init.name] = peak(numpy_helper.to_array(init))
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type in FLOAT_TYPES:
                    values[n.output[0]] = peak(numpy_helper.to_array(a.t))
    peaks: Dict[str, float] = {}
    for n in model.graph.node:
        found = [values[i] for i in n.input if i in values]
        if found:
            peaks[n.name] = max(found)
    return peaks


def cast_aliases(model: onnx.ModelProto, known: Set[str]) -> Dict[str, str]:
    """For each tensor of ``model`` that is not in ``known``, a tensor of ``known`` holding the same
    reference value through a chain of float-to-float Casts (a conversion's inserted Casts), when
    there is one.

    Args:
        model: the target model.
        known: the tensor names the reference has.

    Returns:
        ``{target tensor: reference tensor}`` (identity entries left out).
    """
    edges: Dict[str, Set[str]] = {}
    for n in model.graph.node:
        if n.op_type == "Cast" and any(a.name == "to" and a.i in FLOAT_TYPES for a in n.attribute):
            a, b = n.input[0], n.output[0]
            edges.setdefault(a, set()).add(b)
            edges.setdefault(b, set()).add(a)
    alias: Dict[str, str] = {}
    for start in edges:
        if start in known:
            continue
        seen, frontier = {start}, [start]
        while frontier:
            nxt = []
            for name in frontier:
                for other in edges.get(name, ()):
                    if other not in seen:
                        seen.add(other)
                        nxt.append(other)
            found = sorted(s for s in nxt if s in known)
            if found:
                alias[start] = found[0]
                break
            frontier = nxt
    return alias


def tensor_types(model: onnx.ModelProto) -> Dict[str, int]:
    """``{tensor name: ONNX elem type}`` of the model's top-level tensors, from type inference."""
    try:
        typed = infer_shapes(weightless(model)[0])  # types need no weights
    except Exception as e:  # inference can fail on custom ops; declared types are then all there is
        log.warning("Type inference failed (%s); using declared types", first_line(e))
        typed = model
    g = typed.graph
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    types.update({i.name: i.data_type for i in g.initializer})
    return {k: v for k, v in types.items() if v}


def fed_value(value: np.ndarray, elem_type: int) -> Tuple[np.ndarray, bool]:
    """A reference value as a node's input of type ``elem_type``: cast (``as_declared``), with finite
    values past fp16's range saturated to +-65504 rather than turned into Inf. Returns the value and
    whether any was saturated."""
    if elem_type == onnx.TensorProto.FLOAT16 and np.asarray(value).dtype.kind == "f":
        a = np.asarray(value)
        big = np.isfinite(a) & (np.abs(a) > FLOAT16.max_finite)
        if big.any():
            return np.clip(a, -FLOAT16.max_finite, FLOAT16.max_finite).astype(np.float16), True
    return as_declared(value, elem_type), False


def worse(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether statistics ``a`` are worse than ``b`` (a failure, new NaN/Inf, then rel_l2)."""
    return (not a["passed"], a["new_nonfinite"] > 0, nan_as_inf(a["rel_l2"])) > (
        not b["passed"],
        b["new_nonfinite"] > 0,
        nan_as_inf(b["rel_l2"]),
    )


def nan_as_inf(x: float) -> float:
    """``x`` for ranking errors, a NaN error counting as the worst (inf)."""
    return float("inf") if x != x else x


def peak(value: np.ndarray) -> float:
    """The largest finite |value| of a float array (inf when none is finite; 0.0 for other or empty arrays)."""
    a = np.asarray(value)
    if a.dtype.kind != "f" or a.size == 0:
        return 0.0
    top = max(float(a.max()), -float(a.min()))  # no copy of the array: a 7B decoder's weights are 30 GB
    if np.isfinite(top):
        return top
    finite = np.abs(a[np.isfinite(a)])  # a NaN or inf among them: the finite ones alone
    return float(finite.max()) if finite.size else float("inf")
