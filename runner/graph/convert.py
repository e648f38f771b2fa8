"""Convert a model to fp16 (or bf16) except a kept set of nodes, which stay in fp32.

Uses onnxconverter-common's float16 converter (``convert_float_to_float16`` with its
``node_block_list``): a maintained, dependency-light converter that keeps graph I/O types
(``keep_io_types``), converts only float tensors (integer, bool and shape tensors are left
alone), walks If/Loop/Scan bodies, keeps ops that have no fp16 kernels in fp32 (its default
op block list) and inserts Casts at every fp32/fp16 boundary. NVIDIA ModelOpt's AutoCast does
the same job but pulls in a much heavier dependency tree; we only need the conversion.

Two of the converter's habits would round kept tensors through fp16, and are repaired here:
a blocked Constant node still gets a Cast to fp16 and back (so Constant nodes become
initializers first, which the converter leaves in fp32 when only kept nodes use them), and an
output with several consumers gets a fp32 -> fp16 -> fp32 Cast round trip even between two
kept nodes (so such round trips are bypassed after conversion).

bf16 is not offered by that converter: the model is converted to fp16 as above, then every
fp16 type becomes bf16 and every converted initializer/Constant is re-made from its original
fp32 values (so the fp16 range clipping does not apply to bf16).
"""

from __future__ import annotations

import logging
import warnings
from typing import Dict, Iterable, List

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from runner.errors import ModelError
from runner.graph.constants import constants_to_initializers
from runner.graph.meta import infer_shapes
from runner.graph.toposort import linear_sort

log = logging.getLogger(__name__)

FP16_MAX = 65504.0


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which every top-level node has a unique name (the block list needs names)."""
    named = onnx.ModelProto()
    named.CopyFrom(model)
    seen: Dict[str, int] = {}
    for i, node in enumerate(named.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}" if not node.name else f"{node.name}_{i}"
        seen[node.name] = i
    return named


def restore_output_types(converted: onnx.ModelProto, original: onnx.ModelProto) -> int:
    """Give graph outputs back their original float type, in place; return how many were fixed.

    With ``keep_io_types``, onnxconverter-common still ends an output whose producer is blocked
    (kept in fp32) with a Cast to float16 and declares it float16, so a kept node's output would
    be rounded through fp16 (and overflow past 65504) on its way out. That Cast is retargeted to
    the original type.
    """
    types = {o.name: o.type.tensor_type.elem_type for o in original.graph.output}
    producers = {name: node for node in converted.graph.node for name in node.output}
    fixed = 0
    for out in converted.graph.output:
        want = types.get(out.name)
        have = out.type.tensor_type.elem_type
        if want is None or want == have or have not in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            continue
        cast = producers.get(out.name)
        if cast is None or cast.op_type != "Cast":
            continue
        for attr in cast.attribute:
            if attr.name == "to":
                attr.i = want
        out.type.tensor_type.elem_type = want
        fixed += 1
    return fixed


def drop_round_trips(model: onnx.ModelProto) -> int:
    """Bypass ``fp32 -> Cast(fp16) -> Cast(fp32)`` chains in place; return how many consumers were rewired.

    A consumer of the second Cast then reads the fp32 tensor directly; Casts left without
    consumers are removed. Graph outputs are never rewired.
    """
    try:
        typed = infer_shapes(model)
    except Exception:  # no types, no safe rewrite
        return 0
    g = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(typed.graph.value_info) + list(g.input)}
    types.update({i.name: i.data_type for i in g.initializer})
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    replace = {}
    for node in g.node:
        if node.op_type != "Cast" or node.attribute[0].i != TensorProto.FLOAT or node.output[0] in outputs:
            continue
        first = producer.get(node.input[0])
        if (
            first is not None
            and first.op_type == "Cast"
            and first.attribute[0].i in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
            and types.get(first.input[0]) == TensorProto.FLOAT
        ):
            replace[node.output[0]] = first.input[0]
    rewired = 0
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in replace:
                node.input[i] = replace[name]
                rewired += 1
    while True:  # drop Casts nobody reads any more
        used = {i for n in g.node for i in n.input} | outputs
        dead = [n for n in g.node if n.op_type == "Cast" and n.output[0] not in used]
        if not dead:
            return rewired
        for n in dead:
            g.node.remove(n)


def _bf16_tensor(values: np.ndarray, name: str) -> TensorProto:
    """fp32 values as a bfloat16 TensorProto, rounded to nearest even."""
    u32 = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    bits = (u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16
    t = TensorProto(name=name, data_type=TensorProto.BFLOAT16, dims=list(values.shape))
    t.raw_data = bits.astype(np.uint16).tobytes()
    return t


def _retype_bf16(converted: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Turn every fp16 type of ``converted`` into bf16, taking values from ``original``'s fp32 data."""
    originals = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    const_values = {
        n.name: numpy_helper.to_array(a.t)
        for n in original.graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    }

    def fix_graph(g: onnx.GraphProto) -> None:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
                vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
        for i, init in enumerate(g.initializer):
            if init.data_type == TensorProto.FLOAT16:
                values = originals.get(init.name, numpy_helper.to_array(init).astype(np.float32))
                g.initializer[i].CopyFrom(_bf16_tensor(values, init.name))
        for node in g.node:
            for attr in node.attribute:
                if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT16:
                    attr.i = TensorProto.BFLOAT16
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                    values = const_values.get(node.name, numpy_helper.to_array(attr.t).astype(np.float32))
                    attr.t.CopyFrom(_bf16_tensor(values, attr.t.name))
                if attr.type == onnx.AttributeProto.GRAPH:
                    fix_graph(attr.g)
                for sub in attr.graphs:
                    fix_graph(sub)

    fix_graph(converted.graph)


def convert_except(model: onnx.ModelProto, keep: Iterable[str], low: str = "float16") -> onnx.ModelProto:
    """Convert ``model`` to ``low`` precision except the nodes named in ``keep``.

    Args:
        model: an fp32 model whose nodes all have unique names (see ``name_nodes``) and whose
            Constant nodes are initializers (see ``runner.graph.constants``); not modified.
        keep: names of nodes to keep in fp32.
        low: "float16" or "bfloat16".

    Returns:
        The mixed-precision model, with the original graph input and output types.

    Raises:
        ModelError: when the converter fails on the model.
    """
    from onnxconverter_common import float16

    block: List[str] = sorted(set(keep))
    try:
        with warnings.catch_warnings(), linear_sort():
            warnings.simplefilter("ignore")  # the converter warns once per clipped weight
            converted = float16.convert_float_to_float16(
                model,
                min_positive_val=5.96e-08,
                max_finite_val=FP16_MAX,
                keep_io_types=True,
                disable_shape_infer=False,
                node_block_list=block,
                check_fp16_ready=False,
            )
    except Exception as e:  # the converter raises plain Exceptions/ValueErrors
        raise ModelError(f"onnxconverter-common could not convert the model to float16: {e}") from None
    drop_round_trips(converted)
    restore_output_types(converted, model)
    if low == "bfloat16":
        if min(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
            raise ModelError(
                "bfloat16 needs opset 13 or newer (Cast to bfloat16); "
                "convert the model's opset first or use low_precision=float16"
            )
        _retype_bf16(converted, model)
    return converted


def float_nodes(model: onnx.ModelProto) -> List[int]:
    """Indices of top-level nodes that compute float tensors (the nodes precision marking can keep).

    Constant nodes are left out, as Polygraphy leaves out constant layers.
    """
    try:
        typed = infer_shapes(model)
    except Exception:  # inference failure: fall back to declared types only
        typed = model
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in list(typed.graph.value_info) + list(typed.graph.output) + list(typed.graph.input)
    }
    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
    out = []
    for i, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue
        if any(types.get(o) in floats for o in node.output) or any(types.get(x) in floats for x in node.input):
            out.append(i)
    return out


LOW_TYPES = {TensorProto.FLOAT16, TensorProto.BFLOAT16}


def has_low_precision(model: onnx.ModelProto) -> bool:
    """Whether the top-level graph holds any float16 or bfloat16 tensor (weights, declared types, Casts)."""
    g = model.graph
    if any(t.data_type in LOW_TYPES for t in g.initializer):
        return True
    if any(v.type.tensor_type.elem_type in LOW_TYPES for v in list(g.input) + list(g.output) + list(g.value_info)):
        return True
    for node in g.node:
        for attr in node.attribute:
            if (node.op_type == "Cast" and attr.name == "to" and attr.i in LOW_TYPES) or (
                attr.HasField("t") and attr.t.data_type in LOW_TYPES
            ):
                return True
    return False


def to_low_precision(model: onnx.ModelProto, low: str = "float16") -> onnx.ModelProto:
    """``model`` with every float tensor and weight in ``low`` (graph input and output types kept), as
    TensorRT's ``--fp16`` runs an fp32 model; nodes without low-precision kernels stay fp32 (the
    converter's op block list).

    Raises:
        ModelError: when the converter fails on the model.
    """
    return convert_except(constants_to_initializers(name_nodes(model)), [], low)
