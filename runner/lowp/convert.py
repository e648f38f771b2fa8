"""Convert a model to fp16 (or bf16) except a kept set of nodes, which stay in fp32.

Uses ONNX Runtime's float16 converter (``onnxruntime.transformers.float16``, shipped inside the
onnxruntime wheel): it keeps graph I/O types (``keep_io_types``), converts only float tensors,
walks If/Loop/Scan bodies, keeps ops without fp16 kernels in fp32 (its default op block list)
and the kept nodes (``node_block_list``), with Casts at every fp32/fp16 boundary. Measured on
real exports (``../shared/models``: BERT, GPT-2 and ViT from torch.onnx and timm, the PaddleOCR
models, the If-bodied VAD model), all of its whole-model conversions load and run in ONNX Runtime,
where onnxconverter-common's left graph outputs that are also read inside the graph, explicit
Casts and If bodies with contradictory types on 4 of 7.

Its habits that would round kept values through fp16 are repaired (``runner.lowp.conversion_repairs``):

- a weight read by a kept node and by a converted node is converted once and read by the kept
  node through a Cast back, rounded: kept nodes get an fp32 copy of such weights first;
- a kept node's output that a kept node (or a graph output) reads goes fp32 -> fp16 -> fp32
  through two Casts: such round trips are bypassed after conversion;
- its Casts are appended after the graph's nodes: the graph is sorted again (stable).

bf16 is the same conversion, then every fp16 type becomes bf16 and every converted weight is
made again from its fp32 values (fp16's range clipping does not apply). An op whose ONNX schema,
at the model's opset, has no bf16 type (Conv before opset 22) stays fp32, with a log line; a
model below opset 13 (the first with bf16 Casts) has its opset raised first.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Callable, Dict, FrozenSet, Iterable, List, Set, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto

from runner.errors import ModelError, first_line
from runner.graph.constants import constants_to_initializers
from runner.graph.isolate import bodies, has_body
from runner.graph.stubs import bfloat16_bytes, fill, float16_of, is_stub, raw_bytes, weightless
from runner.graph.toposort import sort_topology
from runner.graph.weight_file import maps, weight_bytes, weight_file
from runner.lowp.conversion_repairs import (
    bypass_round_trips,
    declare_weights_as_stored,
    drop_duplicate_casts,
    drop_identity_casts,
    fp32_copies_for_kept,
    fp32_reads_in_kept_bodies,
    home_stray_casts,
    retype_bf16,
)
from runner.lowp.precisions import BFLOAT16, FLOAT16, LOW_TYPES, LowPrecision, low_precision

log = logging.getLogger(__name__)


def name_nodes(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """``model`` with a unique name on every top-level node (the block list needs names): a copy, or
    ``model`` itself with ``in_place`` (a run's own model: a copy of a large one costs its size)."""
    named = model
    if not in_place:
        named = onnx.ModelProto()
        named.CopyFrom(model)
    seen: Dict[str, int] = {}
    for i, node in enumerate(named.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}" if not node.name else f"{node.name}_{i}"
        seen[node.name] = i
    return named


def onnx_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset version."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def raise_opset(model: onnx.ModelProto, version: int, why: str) -> onnx.ModelProto:
    """``model`` at default-domain opset ``version`` or newer (``onnx.version_converter``), logged.

    Args:
        model: the model (not modified).
        version: the opset it needs.
        why: what needs it, for the log line, e.g. "bfloat16 Casts".

    Returns:
        ``model`` itself when its opset is high enough, else a converted copy, its IR version raised to
        the least that opset needs (the converter leaves it as it was).

    Raises:
        ModelError: when ONNX's version converter cannot convert the model.
    """
    have = onnx_opset(model)
    if have >= version:
        return model
    from onnx import version_converter

    try:
        raised = version_converter.convert_version(model, version)
    except Exception as e:  # the converter raises RuntimeError/ValidationError from C++
        raise ModelError(
            f"{why} need opset {version}, and ONNX's version converter cannot raise the model from opset {have}: "
            f"{first_line(e)}; convert the model's opset first"
        ) from None
    # the converter keeps the IR version, which may be older than the opset (opset 19 needs IR 9)
    raised.ir_version = max(raised.ir_version, onnx.helper.find_min_ir_version_for(list(raised.opset_import)))
    log.info("The model's opset was raised from %d to %d for %s (onnx.version_converter)", have, version, why)
    return raised


def ops_without(model: onnx.ModelProto, low: LowPrecision) -> List[str]:
    """Default-domain op types of ``model`` (bodies included) whose schema, at the model's opset,
    takes float32 but not ``low`` for some input: they cannot be converted and stay fp32.

    Args:
        model: the model.
        low: float16 or bfloat16.
    """
    opset = onnx_opset(model)
    want = low_precision(low).schema_type
    missing = []
    ops: Set[str] = set()
    graphs = [model.graph]
    while graphs:  # bodies of If/Loop/Scan too
        graph = graphs.pop()
        ops.update(n.op_type for n in graph.node if n.domain in ("", "ai.onnx"))
        graphs.extend(body for n in graph.node for body in bodies(n))
    for op in sorted(ops):
        try:
            schema = onnx.defs.get_schema(op, opset)
        except Exception:  # not a standard op at this opset: the converter's defaults decide
            continue
        # the type constraints of the inputs and of the first output (others are statistics, e.g.
        # LayerNormalization's fp32 mean, which stay float32 whatever the input type)
        used = {i.type_str for i in schema.inputs} | {o.type_str for o in schema.outputs[:1]}
        for constraint in schema.type_constraints:
            allowed = set(constraint.allowed_type_strs)
            if constraint.type_param_str in used and "tensor(float)" in allowed and want not in allowed:
                missing.append(op)
                break
    return missing


def _value_info_from_dims(tensor: TensorProto) -> onnx.ValueInfoProto:
    """ONNX Runtime's ``float16.make_value_info_from_tensor``, reading the shape from the tensor's dims
    instead of decoding its values (the same shape for every well-formed tensor; a stub has no values)."""
    return onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))


class Converter:
    """Converts one prepared fp32 model to a low precision, keeping any set of its nodes in fp32.

    Shape inference runs once here, not once per conversion; each ``convert`` copies the inferred
    model and converts the copy.

    Args:
        model: an fp32 model whose top-level nodes have unique names (``name_nodes``) and whose
            Constant nodes are initializers (``constants_to_initializers``); at opset 13 or newer
            for bfloat16 (``raise_opset``). Not modified.
        low: "float16" or "bfloat16".

    Raises:
        ConfigError-free; ModelError: bfloat16 below opset 13.
    """

    def __init__(self, model: onnx.ModelProto, low: LowPrecision = FLOAT16):
        from onnxruntime.transformers import float16

        # the converter decodes each converted weight only to read its shape: it reads the dims here
        float16.make_value_info_from_tensor = _value_info_from_dims
        target = low_precision(low)
        if onnx_opset(model) < target.min_opset:
            raise ModelError(
                f"{low} needs opset {target.min_opset} or newer (Cast to {low}); raise the model's opset first"
            )
        self.model, self.low = model, target
        self.blocked_ops = set(float16.DEFAULT_OP_BLOCK_LIST) | set(ops_without(model, low))
        extra = sorted(set(ops_without(model, low)) - set(float16.DEFAULT_OP_BLOCK_LIST))
        if extra:
            log.info(
                "ONNX defines no %s %s at opset %d: those nodes stay float32",
                low,
                ", ".join(extra),
                onnx_opset(model),
            )
        # the converter reads the graph; the weights are converted once each (``_values``) and put back
        bare, self.weights = weightless(model, keep=lambda t: t.data_type != TensorProto.FLOAT)
        try:
            self.typed = onnx.shape_inference.infer_shapes(bare, strict_mode=False, data_prop=True)
        except Exception:  # a model inference cannot type: the converter sees what is declared
            self.typed = bare
        # each weight's low-precision bytes, made once: the bytes, or where the weight file holds them
        self._low: Dict[str, Union[bytes, Tuple[int, int]]] = {}
        self.large = maps(weight_bytes(model))
        self._lock = threading.Lock()
        #: some node holds a body (If, Loop, Scan)
        self.flow = any(has_body(n) for n in model.graph.node)

    def convert(self, keep: Iterable[str]) -> onnx.ModelProto:
        """The model in the low precision except the nodes named in ``keep``, which stay fp32.

        Args:
            keep: names of top-level nodes to keep in fp32.

        Returns:
            A new mixed-precision model with the original graph input and output types, nodes
            in topological order. Not validated here (``runner.graph.validate``).

        Raises:
            ModelError: when the converter fails on the model.
        """
        from onnxruntime.transformers import float16

        kept = frozenset(keep)
        blocked = kept | self._inside(kept)  # a kept If/Loop/Scan keeps its bodies fp32 too
        work = onnx.ModelProto()
        work.CopyFrom(self.typed)
        copies = fp32_copies_for_kept(work, kept, self.blocked_ops)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the converter warns once per clipped weight
                converted = float16.convert_float_to_float16(
                    work,
                    min_positive_val=5.96e-08,
                    max_finite_val=FLOAT16.max_finite,
                    keep_io_types=True,
                    disable_shape_infer=True,  # inferred once, in __init__
                    op_block_list=sorted(self.blocked_ops),
                    node_block_list=sorted(blocked),
                )
        except Exception as e:  # the converter raises plain Exceptions, ValueErrors and asserts
            raise ModelError(f"ONNX Runtime's float16 converter could not convert the model: {e}") from None
        drop_duplicate_casts(converted.graph)
        if self.flow:  # the repairs of bodies (If/Loop/Scan)
            home_stray_casts(converted)
            fp32_reads_in_kept_bodies(converted, kept)
        bypass_round_trips(converted)
        declare_weights_as_stored(converted.graph)
        drop_identity_casts(converted)
        try:
            sort_topology(converted.graph)
        except ValueError as e:
            raise ModelError(f"the float16 conversion left a graph that cannot be sorted: {e}") from None
        stubs = frozenset(self.weights) | frozenset(copies)
        if str(self.low) == BFLOAT16.name:
            retype_bf16(converted, self.model, stubs)
        self._place(converted, copies, stubs)
        return converted

    def _place(self, converted: onnx.ModelProto, copies: Dict[str, str], stubs: FrozenSet[str]) -> None:
        """Give ``converted``'s stubs their values, in place: a large model's point into the weight file,
        where each weight's form is written once per run (a candidate of a 212 MB decoder then copies
        no weight; ``runner.graph.weight_file``), other models' get the bytes."""
        if not self.large:
            fill(converted, lambda stub: self._values(copies.get(stub.name, stub.name), stub.data_type), stubs)
            return
        file = weight_file()
        for init in converted.graph.initializer:
            if init.name in stubs and is_stub(init):
                made = self._made(copies.get(init.name, init.name), init.data_type)
                if isinstance(made, tuple):
                    file.refer(init, made)
                else:  # the weight file could not take it
                    init.raw_data = made

    def _inside(self, kept: FrozenSet[str]) -> FrozenSet[str]:
        """Names of the nodes inside the bodies (If/Loop/Scan, nested) of the kept top-level nodes."""
        if not self.flow:
            return frozenset()
        names: Set[str] = set()
        stack = [body for n in self.model.graph.node if n.name in kept for body in bodies(n)]
        while stack:
            body = stack.pop()
            for node in body.node:
                if node.name:
                    names.add(node.name)
                stack.extend(bodies(node))
        return frozenset(names)

    def _values(self, name: str, data_type: int) -> bytes:
        """The model's weight ``name`` as raw bytes of ``data_type`` (``_made``)."""
        made = self._made(name, data_type)
        return weight_file().read(made) if isinstance(made, tuple) else made

    def _made(self, name: str, data_type: int) -> Union[bytes, Tuple[int, int]]:
        """The model's weight ``name`` as raw bytes of ``data_type``: fp32 as stored, fp16 clipped as
        ONNX Runtime's converter clips it, bf16 rounded to nearest even; each low one made once. A
        large model's forms (its fp32 ones too) are written to the weight file once and given as
        (offset, length) there."""
        source = self.weights[name]
        if data_type == source.data_type and not self.large:
            return raw_bytes(source)
        key = f"{data_type}:{name}"
        with self._lock:
            made = self._low.get(key)
        if made is not None:
            return made
        make: Callable[[bytes], bytes]
        if data_type == source.data_type:
            make, tag = bytes, ""
        elif data_type == TensorProto.FLOAT16:
            make, tag = _to_float16, "float16"
        elif data_type == TensorProto.BFLOAT16:
            make, tag = _to_bfloat16, "bfloat16"
        else:
            raise ModelError(f"the conversion retyped weight {name} to ONNX type {data_type}, which it never does")
        kept: Union[bytes, Tuple[int, int], None] = None
        if self.large:  # a large model's forms wait in the weight file (each written once), not in memory
            kept = weight_file().form(source, None if make is bytes else make, tag)
        if kept is None:  # a small model, or the weight file could not take it
            kept = make(raw_bytes(source))
            if data_type == source.data_type:
                return kept  # no second copy of the model's own weight is held
        with self._lock:
            self._low[key] = kept
        return kept


def _to_float16(data: bytes) -> bytes:
    """fp32 bytes as fp16 bytes, clipped as ONNX Runtime's converter clips them (``float16_of``)."""
    return float16_of(np.frombuffer(data, dtype=np.float32), 5.96e-08, FLOAT16.max_finite)


def _to_bfloat16(data: bytes) -> bytes:
    """fp32 bytes as bfloat16 bytes, rounded to nearest even (``bfloat16_bytes``)."""
    return bfloat16_bytes(np.frombuffer(data, dtype=np.float32))


def convert_except(model: onnx.ModelProto, keep: Iterable[str], low: LowPrecision = FLOAT16) -> onnx.ModelProto:
    """``Converter(model, low).convert(keep)``: one conversion (a strategy keeps its ``Converter``).

    Raises:
        ModelError: when the converter fails on the model.
    """
    return Converter(model, low).convert(keep)


def float_nodes(model: onnx.ModelProto) -> List[int]:
    """Indices of top-level nodes that compute float tensors (the nodes precision marking can keep).

    Constant nodes are left out, as Polygraphy leaves out constant layers.
    """
    from runner.graph.meta import infer_shapes

    try:
        typed = infer_shapes(weightless(model)[0])  # types need no weights (a copy of them would cost their size)
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


def prepare(model: onnx.ModelProto, low: LowPrecision = FLOAT16, in_place: bool = False) -> onnx.ModelProto:
    """``model`` made ready for ``Converter``: opset raised as the precision needs (bfloat16: 13, 16
    with If/Loop/Scan), nodes named, Constant nodes as initializers, Identity nodes that forward a
    weight folded (``fold_weight_identities``).

    Args:
        model: the model.
        low: the low precision.
        in_place: change ``model`` itself, unless its opset must be raised (a run's own model: each
            copy of a large model costs its size for the whole run).

    Returns:
        The prepared model: a copy, or ``model`` itself with ``in_place``.

    Raises:
        ModelError: the opset cannot be raised.
    """
    from runner.graph.constants import fold_weight_identities

    target = low_precision(low)
    flow = any(bodies(n) for n in model.graph.node)
    raised = raise_opset(model, target.control_flow_opset if flow else target.min_opset, f"{low} tensors")
    named = name_nodes(raised, in_place=in_place or raised is not model)
    return fold_weight_identities(constants_to_initializers(named, in_place=True), in_place=True)


def to_low_precision(model: onnx.ModelProto, low: LowPrecision = FLOAT16) -> onnx.ModelProto:
    """``model`` with every float tensor and weight in ``low`` (graph input and output types kept), as
    TensorRT's ``--fp16`` runs an fp32 model; ops without low-precision kernels or types stay fp32.

    Raises:
        ModelError: when the converter fails on the model.
    """
    return convert_except(prepare(model, low), [], low)
