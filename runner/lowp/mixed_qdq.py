"""int8 with the float rest in fp16: QDQ candidates as TensorRT's ``--int8 --fp16`` builds them, strongly typed.

TensorRT 11 takes precision from the ONNX graph: an int8 node reads its inputs through
QuantizeLinear/DequantizeLinear (Q/DQ), and every other node runs in the type its tensors have. So
"int8 where it holds, fp16 elsewhere, fp32 where fp16 breaks" is one ONNX model: the QDQ candidate
(``runner.lowp.placement`` or ``runner.lowp.quantize``) converted to fp16 by ONNX Runtime's float16
converter (``runner.lowp.convert.Converter``) except a set of nodes that stay fp32, with the Q/DQ
typed in fp16 where their neighbours are:

- the converter keeps the Q/DQ nodes fp32 (they are in its node block list) and puts Casts at every
  fp32/fp16 boundary: ``fp16 -> Cast(fp32) -> QuantizeLinear`` and ``DequantizeLinear -> Cast(fp16)``;
- ``fold_qdq_casts`` then folds those Casts into the Q/DQ (opset 19, where QuantizeLinear takes an
  fp16 input and DequantizeLinear gives an fp16 output, each with an fp16 scale): the Q/DQ sits right
  against the int8 node, where TensorRT fuses it.

A weight's per-channel scale below fp16's smallest normal number (2**-14: a channel of weights near
zero, e.g. 1e-37 on a dead channel of the detector) is raised to it and that channel's int8 values
quantized again from what they dequantize to (they round to 0 or a few steps: in fp16 such weights
were subnormal or zero anyway), so the weight's DequantizeLinear still feeds its node directly.
An activation's scale that fp16 cannot hold stays fp32 with its Casts, said in the log.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from runner.graph.isolate import outer_reads
from runner.graph.qdq import is_qdq
from runner.graph.stubs import float16_bytes
from runner.graph.toposort import sort_topology
from runner.lowp.convert import Converter
from runner.lowp.precisions import FLOAT16, LowPrecision
from runner.lowp.quantize import drop_unread

log = logging.getLogger(__name__)

#: QuantizeLinear with an fp16 input and DequantizeLinear with an fp16 output need opset 19
MIXED_OPSET = 19
#: the smallest normal fp16 number (2**-14): a smaller scale would be a subnormal with fewer bits
FP16_TINY = float(np.finfo(np.float16).tiny)


def _scale_fits(values: np.ndarray) -> bool:
    """Whether every scale value is a normal fp16 number (its magnitude in [2**-14, 65504])."""
    magnitude = np.abs(values.astype(np.float64))
    return bool(np.all((magnitude >= FP16_TINY) & (magnitude <= FLOAT16.max_finite)))


def fold_qdq_casts(model: onnx.ModelProto, low: LowPrecision = FLOAT16) -> Tuple[int, int]:
    """Fold the converter's Casts into the Q/DQ they sit against, in place (top-level graph).

    A QuantizeLinear whose input is ``Cast(to=float32)`` of a ``low`` tensor reads that tensor
    directly with a ``low`` copy of its scale; a DequantizeLinear whose output only ``Cast(to=low)``
    nodes read gives their output directly, with a ``low`` scale. Casts nothing reads any more are
    removed, and with them their stale ``value_info``.

    Args:
        model: a converted QDQ model at opset 19 or newer (``MIXED_OPSET``), ``value_info`` as the
            converter left it (the types of the Casts' inputs are read there).
        low: the float precision of the rest (fp16).

    Returns:
        (Q/DQ nodes folded, Q/DQ nodes left fp32 because their scale is no normal ``low`` number).
    """
    g = model.graph
    types: Dict[str, int] = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update((i.name, i.data_type) for i in g.initializer)
    producer = {o: n for n in g.node for o in n.output}
    readers: Dict[str, List[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    inits = {i.name: i for i in g.initializer}
    outputs = {o.name for o in g.output} | outer_reads(g)  # a tensor a body reads keeps its name and type
    lowered: Dict[str, Optional[str]] = {}  # scale name -> its ``low`` copy (None: it does not fit)
    raised: Dict[Tuple[str, str], Tuple[str, str]] = {}  # (weight, scale) -> (int8 values, scale) raised
    fresh = _namer(g)

    def low_scale(name: str) -> Optional[str]:
        if name not in lowered:
            values = numpy_helper.to_array(inits[name]) if name in inits else None
            if values is None or not _scale_fits(values):
                lowered[name] = None
            else:
                lowered[name] = fresh(f"{name}_{low}")
                g.initializer.append(numpy_helper.from_array(values.astype(np.float16), lowered[name]))
        return lowered[name]

    def raised_weight(node: onnx.NodeProto) -> Optional[Tuple[str, str]]:
        """A weight's DequantizeLinear whose scale is below fp16's smallest normal: the channels' scales
        raised to it and their int8 values quantized again; None for anything else."""
        weight, scale = node.input[0], node.input[1]
        if weight not in inits or scale not in inits or inits[weight].data_type != TensorProto.INT8:
            return None
        if (weight, scale) not in raised:
            q = numpy_helper.to_array(inits[weight]).astype(np.float64)
            old = numpy_helper.to_array(inits[scale]).astype(np.float64)
            new = np.clip(np.abs(old), FP16_TINY, None) * np.where(old < 0, -1.0, 1.0)
            if not _scale_fits(new.astype(np.float16)):
                return None
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            if old.ndim == 1 and q.ndim:
                shape[axis % q.ndim] = -1
            ratio = (old / new).reshape(shape) if old.ndim == 1 else old / new
            values = np.clip(np.rint(q * ratio), -127, 127).astype(np.int8)
            names = fresh(f"{weight}_{low}"), fresh(f"{scale}_{low}")
            g.initializer.append(numpy_helper.from_array(values, names[0]))
            g.initializer.append(numpy_helper.from_array(new.astype(np.float16), names[1]))
            raised[(weight, scale)] = names
        return raised[(weight, scale)]

    def is_cast_to(node: onnx.NodeProto, to: int) -> bool:
        return node.op_type == "Cast" and any(a.name == "to" and a.i == to for a in node.attribute)

    folded = unfit = 0
    renamed: Dict[str, str] = {}
    for node in g.node:
        if node.op_type == "QuantizeLinear":
            cast = producer.get(node.input[0])
            if cast is None or not is_cast_to(cast, TensorProto.FLOAT) or types.get(cast.input[0]) != low.elem_type:
                continue
            scale = low_scale(node.input[1])
            if scale is None:
                unfit += 1
                continue
            node.input[0], node.input[1] = cast.input[0], scale
            folded += 1
        elif node.op_type == "DequantizeLinear":
            casts = readers.get(node.output[0], [])
            if not casts or node.output[0] in outputs or not all(is_cast_to(c, low.elem_type) for c in casts):
                continue
            scale = low_scale(node.input[1])
            if scale is None:
                made = raised_weight(node)
                if made is None:
                    unfit += 1
                    continue
                node.input[0], scale = made
            node.input[1] = scale
            node.output[0] = casts[0].output[0]
            for cast in casts:
                renamed[cast.output[0]] = node.output[0]
                cast.output[0] = ""  # nothing produces it now: removed below
            folded += 1
    for node in g.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    _drop_dead_casts(g)
    if unfit:
        log.info("%d Q/DQ stay float32 with Casts: their scales are no normal %s numbers", unfit, low)
    return folded, unfit


def _drop_dead_casts(g: onnx.GraphProto) -> None:
    """Remove Casts whose outputs nothing reads (repeatedly; a body's read counts), then unread initializers
    and stale value_info."""
    outputs = {o.name for o in g.output} | outer_reads(g)
    while True:
        read = {name for node in g.node for name in node.input} | outputs
        dead = [k for k, n in enumerate(g.node) if n.op_type == "Cast" and not any(o and o in read for o in n.output)]
        if not dead:
            break
        for k in reversed(dead):
            del g.node[k]
    read = {name for node in g.node for name in node.input} | outputs
    kept_inits = [i for i in g.initializer if i.name in read]
    if len(kept_inits) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(kept_inits)
    _drop_stale_value_info(g)


def _namer(g: onnx.GraphProto) -> Callable[[str], str]:
    """A maker of tensor and initializer names not yet in ``g``: ``name``, else ``name_1``, ``name_2``, ..."""
    taken = {i.name for i in g.initializer} | {o for n in g.node for o in n.output} | {i.name for i in g.input}

    def fresh(name: str) -> str:
        made, k = name, 1
        while made in taken:
            made, k = f"{name}_{k}", k + 1
        taken.add(made)
        return made

    return fresh


def _drop_stale_value_info(g: onnx.GraphProto) -> None:
    """Drop the ``value_info`` of tensors no node or graph input gives any more."""
    produced = {o for node in g.node for o in node.output} | {i.name for i in g.input}
    infos = [v for v in g.value_info if v.name in produced]
    del g.value_info[:]
    g.value_info.extend(infos)


class MixedQuantizer:
    """Builds int8 candidates whose float rest is fp16 (TensorRT's ``--int8 --fp16``).

    Args:
        quantizer: the run's int8 candidate builder (``runner.lowp.quantize.make_quantizer``), on a
            model at opset 19 or newer (``MIXED_OPSET``).
        low: the float precision of the rest (fp16).

    The float16 converter of the last set of int8 nodes is kept (its shape inference runs once). With
    TensorRT's placement, whose Q/DQ a node reads are its own (``PlacedQuantizer.sites``), a candidate
    is made from the fully quantized model of its fp32 nodes, converted once (``_bypassed``): each node
    kept out of int8 reads the tensors its Q/DQ round, as the conversion of its own QDQ model would
    have it read them, 0.02 s instead of the converter's 0.2-0.4 s on the 672-node detector. Where that
    cannot give the same model (a node out of int8 kept in fp32, a DequantizeLinear left fp32), the
    candidate is converted whole. Threads may build candidates at once.
    """

    def __init__(self, quantizer: Any, low: LowPrecision = FLOAT16):
        self.quantizer, self.low = quantizer, low
        self._converter: Optional[Tuple[Tuple[str, ...], Converter, List[str]]] = None
        self._base: Optional[Tuple[Tuple[str, ...], onnx.ModelProto]] = None  # all int8, by fp32 nodes
        self._lock, self._converting = threading.Lock(), threading.Lock()

    def convert(self, out_of_int8: Sequence[str], fp32: Iterable[str]) -> onnx.ModelProto:
        """The model quantized except ``out_of_int8``, in ``low`` except ``fp32`` (node names).

        Returns:
            A new model: Q/DQ in ``low`` where their neighbours are (``fold_qdq_casts``), graph input
            and output types as the model's.

        Raises:
            ModelError: the quantizer or ONNX Runtime's float16 converter fails on the model.
        """
        kept, fp32 = tuple(sorted(out_of_int8)), tuple(sorted(fp32))
        if kept and hasattr(self.quantizer, "sites"):
            with self._lock:  # candidates built ahead in threads share the base
                if self._base is None or self._base[0] != fp32:
                    self._base = (fp32, self._converted((), fp32))
                base = self._base[1]
            fast = _bypassed(base, frozenset(kept), frozenset(fp32), self.quantizer, self.low)
            if fast is not None:
                return fast
        return self._converted(kept, fp32)

    def _converted(self, kept: Sequence[str], fp32: Iterable[str]) -> onnx.ModelProto:
        """The QDQ model of ``kept`` converted whole by the float16 converter, Casts folded."""
        key = tuple(kept)
        with self._converting:  # the converter in hand is this key's, whichever thread asks for another
            if self._converter is None or self._converter[0] != key:
                qdq = self.quantizer.convert(list(key))
                self._converter = (key, Converter(qdq, self.low), [n.name for n in qdq.graph.node if is_qdq(n)])
            _, converter, qdq_nodes = self._converter
        mixed = converter.convert([*fp32, *qdq_nodes])
        fold_qdq_casts(mixed, self.low)
        return mixed

    def blocked(self, model: onnx.ModelProto, nodes: Iterable[int]) -> Set[int]:
        """The ``nodes`` of ``model`` (indices) the converter never converts: op types without ``low``
        kernels or types (its op block list), which stay fp32 in every candidate."""
        if self._converter is None:
            self.convert([], [])
        assert self._converter is not None
        blocked = self._converter[1].blocked_ops
        return {i for i in nodes if model.graph.node[i].op_type in blocked}


def _bypassed(
    base: onnx.ModelProto, kept: FrozenSet[str], fp32: FrozenSet[str], quantizer: Any, low: LowPrecision
) -> Optional[onnx.ModelProto]:
    """``base`` (every placed node in int8, converted and folded) with the nodes named in ``kept`` out of
    int8: each reads the ``low`` tensor its activation Q/DQ rounds, and its weight as the converter makes
    it (``low``, clipped as ONNX Runtime's converter clips); Q/DQ and weights nothing reads any more go.
    An fp32 Q's input (the graph's fp32 input, an activation whose scale stayed fp32) is read in ``low``
    through a Cast, as the converter casts it. None where that would not be the whole conversion's
    model: a kept node in fp32, or a kept node's Q/DQ that is not a DequantizeLinear in ``low``.

    Args:
        base: the fully quantized candidate of the fp32 nodes (``MixedQuantizer._converted``); not modified.
        kept: names of the nodes out of int8.
        fp32: names of the nodes kept in fp32.
        quantizer: the run's ``PlacedQuantizer`` (its ``sites``, fp32 ``model`` and ``inits``).
        low: the float precision of the rest.
    """
    if kept & fp32:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(base)
    g = out.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    original = {n.name: n for n in quantizer.model.graph.node}

    def low_scale(node: onnx.NodeProto) -> bool:
        scale = inits.get(node.input[1]) if len(node.input) > 1 else None
        return scale is not None and scale.data_type == low.elem_type

    types: Dict[str, int] = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    casts: Dict[str, onnx.NodeProto] = {}  # fp32 tensor -> the Cast to ``low`` a kept node reads it through
    fresh = _namer(g)

    def low_of(tensor: str) -> str:
        """``tensor`` (an fp32 Q's input) in ``low``: the fp16 tensor a converter's Cast widened, or a Cast
        to ``low`` of it, as the converter puts one at a graph input a converted node reads."""
        cast = producer.get(tensor)
        if cast is not None and cast.op_type == "Cast" and types.get(cast.input[0]) == low.elem_type:
            return cast.input[0]
        if tensor not in casts:
            name = fresh(f"{tensor}_{low}")
            casts[tensor] = onnx.helper.make_node("Cast", [tensor], [name], name=f"{name}_cast", to=low.elem_type)
        return casts[tensor].output[0]

    added: Dict[str, TensorProto] = {}
    for node in g.node:
        if node.name not in kept:
            continue
        for site in quantizer.sites.get(node.name, []):
            dq = producer.get(node.input[site.index])
            if dq is None or dq.op_type != "DequantizeLinear" or not low_scale(dq):
                return None
            if site.weight:
                name = original[node.name].input[site.index]
                have = inits.get(name)
                if have is not None and have.data_type != low.elem_type:
                    return None
                if have is None and name not in added:
                    source = quantizer.inits[name]
                    made = TensorProto(name=name, data_type=low.elem_type, dims=list(source.dims))
                    made.raw_data = float16_bytes(source, 5.96e-08, low.max_finite)
                    added[name] = made
                node.input[site.index] = name
            else:
                q = producer.get(dq.input[0])
                if q is None or q.op_type != "QuantizeLinear":
                    return None
                node.input[site.index] = q.input[0] if low_scale(q) else low_of(q.input[0])
    g.initializer.extend(added.values())
    if casts:
        g.node.extend(casts.values())
        sort_topology(g)
    drop_unread(out)
    _drop_stale_value_info(g)
    return out
