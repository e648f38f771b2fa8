"""The switchboard of fp16 and bf16 candidates (``runner.lowp.switchboard``): one fp32 model that emulates each.

A candidate is the float16 (bfloat16) conversion keeping a set of nodes in fp32
(``runner.lowp.convert.Converter``), run through the emulation (``runner.lowp.emulate``: fp32
arithmetic, every fp16 tensor rounded through ``Cast``). In the switchboard every node the conversion
changes is an ``If`` whose ``then`` branch is the node converted (its inputs that the conversion makes
fp16 rounded to fp16, weights as the converter stores them; its fp16 outputs rounded) and whose
``else`` branch is the node as it is.

What each node's conversion rounds is read from the converter's own output (the model with no node
kept, typed by shape inference), not assumed: an input the converter keeps fp32 (Resize's scales), an
op it never converts (its block list), a weight's clipped fp16 form all come from there. A node
reading a converted node rounds again what is rounded already (rounding is idempotent), so every
candidate computes the same values as its emulated conversion; ``runner.checkers.compare.switched`` checks
that on its first candidates and stops using the switchboard when any output differs by a bit.

Only models without If/Loop/Scan bodies get one (``runner.lowp.switchboard.unsupported``). A model under
``MAP_BYTES`` of weights holds each converted weight again in its low-precision values (widened to fp32); a
larger one holds no weight: the switched model points into the weight file for its fp32 weights and the
converter's low-precision forms, each widened by a ``Cast`` in the branch that reads it, as its emulated
candidate widens it. fp16 reads "the low precision" below where the conversion is to bfloat16.

With ``native`` (``build_switchboard``) the converted form runs the node as the conversion writes it, in the low
precision, for a device's ONNX Runtime provider (``RunsOn.DEVICE``); there both forms of each switched node run
and a ``Where`` on the switch picks one (``runner.lowp.switchboard.Wiring``'s ``inline``), as an ``If`` per node costs
ONNX Runtime's CUDA provider a stream and cuBLAS handle each.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runner.graph.stubs import weightless
from runner.graph.weight_file import is_pointed, maps, weight_bytes, weight_file
from runner.lowp.convert import Converter
from runner.lowp.emulate import tensor_types
from runner.lowp.switchboard import Switchboard, Wiring, cast_twice, unsupported

log = logging.getLogger(__name__)


def build_switchboard(
    model: onnx.ModelProto, converter: Converter, key: str, native: bool = False
) -> Optional[Switchboard]:
    """The switchboard of ``converter``'s candidates of ``model``, or None where it cannot be made.

    Args:
        model: the prepared fp32 model the converter converts (``runner.lowp.convert.prepare``);
            not modified. Node indices of the switches are this model's.
        converter: its float16 or bfloat16 converter.
        key: the session key of the switched model.
        native: each converted node runs in the low precision itself, as the conversion writes it (its
            low-precision inputs cast from the fp32 tensors, its outputs widened back), instead of being
            emulated: the switched model gives each candidate's own values on a device's ONNX Runtime provider
            with graph optimizations off (``RunsOn.DEVICE``; not on the CPU provider, which computes runs of
            fp16 nodes it has no kernels for in fp32). A large model's native switchboard maps its weights and
            their low-precision forms from the weight file.

    Returns:
        The switchboard; None (with a log line) for a model with If/Loop/Scan bodies, no node the conversion
        changes, or a switched node whose output has no known type or is an optional output left out before a
        present one.

    Raises:
        ModelError: the converter fails on the model.
    """
    why = unsupported(model, any_size=True)
    if why:
        log.info("No switched model: %s; each candidate is built", why)
        return None
    board = weight_file().mapped(model) if maps(weight_bytes(model)) else None
    if board is None:
        board = onnx.ModelProto()
        board.CopyFrom(model)
    g = board.graph
    wiring = Wiring(g, tensor_types(converter.typed), inline=native)
    rounding = _Native(converter, wiring) if native else _Rounding(converter, wiring)
    nodes: List[onnx.NodeProto] = []
    for i, node in enumerate(g.node):
        wrapped = rounding.wrap(i, node)
        if wrapped is None:
            log.info("No switched model: node %s has an output of unknown type; each candidate is built", node.name)
            return None
        nodes.extend(wrapped)
    if not wiring.switches:
        log.info("No switched model: the conversion changes no node")
        return None
    return wiring.finish(board, nodes, rounding.weights, key)


class _Rounding:
    """Wraps each node the conversion changes in its ``If`` (``wrap``), learning what it rounds from
    the converter's output with no node kept.

    Attributes:
        weights: the weights converted nodes read, as the switched model's initializers: their low-precision
            values widened to fp32, or (a large model's, and the native switchboard's) as the converter stores
            them.
    """

    def __init__(self, converter: Converter, wiring: Wiring):
        converted = converter.convert([])
        typed = onnx.shape_inference.infer_shapes(weightless(converted)[0], strict_mode=False)
        self.converted_types = tensor_types(typed)
        self.twins = {n.name: n for n in typed.graph.node}
        self.elem = converter.low.elem_type
        self.low_weights = {t.name: t for t in converted.graph.initializer if t.data_type == self.elem}
        self.wiring = wiring
        self.weights: List[TensorProto] = []
        self._rounded_weights: Dict[str, str] = {}
        self._stored_weights: Dict[str, str] = {}

    def changed(self, node: onnx.NodeProto) -> Optional[Tuple[onnx.NodeProto, List[bool], List[bool]]]:
        """How the conversion writes ``node``: (its converted twin, whether each input and each output is of the
        low precision there), or None where the conversion leaves it as it is (an op it blocks, shape
        arithmetic)."""
        twin = self.twins.get(node.name)
        if twin is None:
            return self._dropped_cast(node)
        low_in = [self.converted_types.get(x) == self.elem for x in twin.input]
        low_out = [self.converted_types.get(x) == self.elem for x in twin.output]
        return (twin, low_in, low_out) if any(low_in) or any(low_out) else None

    def _dropped_cast(self, node: onnx.NodeProto) -> Optional[Tuple[onnx.NodeProto, List[bool], List[bool]]]:
        """``changed`` of a Cast to fp32 of an fp32 tensor (an exporter's ``.to(float32)``, e.g. a Qwen2 RMSNorm's):
        the conversion with no node kept drops it (a Cast of a low tensor to the low type), but a candidate that
        keeps the node making its input writes it as a Cast to the low type, which rounds what a kept node reads
        through it. Its switched form is that Cast (rounding is idempotent where the input is low already); None
        for any other node the conversion leaves out."""
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type != "Cast" or to != TensorProto.FLOAT or self.wiring.types.get(node.input[0]) != to:
            return None
        form = onnx.NodeProto()
        form.CopyFrom(node)
        next(a for a in form.attribute if a.name == "to").i = self.elem
        return form, [True], [True]

    def wrap(self, i: int, node: onnx.NodeProto) -> Optional[List[onnx.NodeProto]]:
        """``[node]`` (index ``i``) when the conversion leaves it as it is, else its switched form's nodes; None
        when it cannot be switched (``Wiring.can_switch``)."""
        change = self.changed(node)
        if change is None:
            return [node]
        _, rounds_in, rounds_out = change
        if not self.wiring.can_switch(node):
            return None
        then: List[onnx.NodeProto] = []
        inputs = {
            slot: self._rounded_input(x, f"{x}__rounded_{i}_{slot}", then)
            for slot, x in enumerate(node.input)
            if x and slot < len(rounds_in) and rounds_in[slot]
        }
        return self.wiring.switch(i, node, then, inputs, rounds_out, self.elem)

    def _stored(self, x: str) -> str:
        """The weight ``x`` as the converter stores it (fp16: clipped; a large model's pointed into the weight
        file), under a name of its own in the board."""
        if x not in self._stored_weights:
            self._stored_weights[x] = self.wiring.fresh(f"{x}__low")
            stored = TensorProto()
            stored.CopyFrom(self.low_weights[x])
            stored.name = self._stored_weights[x]
            self.weights.append(stored)
        return self._stored_weights[x]

    def _rounded_input(self, x: str, name: str, then: List[onnx.NodeProto]) -> str:
        """What a converted node reads for ``x``: a weight as the converter stores it (fp16: clipped),
        widened, else ``x`` rounded in the branch (its Casts appended to ``then``)."""
        if x in self.low_weights and is_pointed(self.low_weights[x]):  # a large model's: widened in the branch
            rounded = self.wiring.fresh(name)
            then.append(helper.make_node("Cast", [self._stored(x)], [rounded], to=TensorProto.FLOAT))
            return rounded
        if x in self.low_weights:
            if x not in self._rounded_weights:
                self._rounded_weights[x] = self.wiring.fresh(f"{x}__low_values")
                values = numpy_helper.to_array(self.low_weights[x]).astype(np.float32)
                self.weights.append(numpy_helper.from_array(values, self._rounded_weights[x]))
            return self._rounded_weights[x]
        rounded = self.wiring.fresh(name)
        then.extend(cast_twice(x, rounded, self.elem))
        return rounded


class _Native(_Rounding):
    """Switches each node the conversion changes between the node as the conversion writes it
    (``build_switchboard``'s ``native``: its low-precision inputs cast from the fp32 tensors, weights as the
    converter stores them, its low-precision outputs widened to fp32) and the node as it is, both in the graph and
    one picked by a ``Where`` on the switch (``Wiring``'s ``inline``: an ``If`` per node costs a device's provider a
    stream and cuBLAS handle each). Widening and casting back are exact, so a node reading a converted node reads
    its low-precision values."""

    def wrap(self, i: int, node: onnx.NodeProto) -> Optional[List[onnx.NodeProto]]:
        change = self.changed(node)
        if change is None:
            return [node]
        twin, low_in, low_out = change
        if not self.wiring.can_switch(node) or len(twin.input) != len(node.input):
            return None
        then: List[onnx.NodeProto] = []
        inputs: Dict[int, str] = {}
        for slot, x in enumerate(node.input):
            if not x or not low_in[slot]:
                inputs[slot] = x  # as the board holds it: non-float, or an input the conversion keeps fp32
            elif x in self.low_weights:
                inputs[slot] = self._stored(x)
            else:
                inputs[slot] = self.wiring.fresh(f"{x}__low_{i}_{slot}")
                then.append(helper.make_node("Cast", [x], [inputs[slot]], to=self.elem))
        return self.wiring.switch(i, node, then, inputs, low_out, self.elem, form=twin)
