"""One fp32 model that emulates every fp16 (or bf16) candidate of a conversion, each node switched by a feed.

A precision search checks many candidates of one model, each the float16 (bfloat16) conversion keeping
a set of nodes in fp32 (``runner.graph.convert.Converter``), each run through the emulation
(``runner.graph.emulate``: fp32 arithmetic, every fp16 tensor rounded through ``Cast``). Converting,
rewriting and loading each candidate in a new ONNX Runtime session costs several times its run on a
model of a few hundred nodes. The switchboard is built once: every node the conversion changes is
wrapped in an ``If`` on a bool scalar input of its own, whose ``then`` branch is the node converted
(its inputs that the conversion makes fp16 rounded to fp16, weights as the converter stores them; its
fp16 outputs rounded) and whose ``else`` branch is the node as it is. One session then runs any
candidate by its feeds: ``True`` for a converted node, ``False`` for a kept one.

What each node's conversion rounds is read from the converter's own output (the model with no node
kept, typed by shape inference), not assumed: an input the converter keeps fp32 (Resize's scales), an
op it never converts (its block list), a weight's clipped fp16 form all come from there. A node
reading a converted node rounds again what is rounded already (rounding is idempotent), so every
candidate computes the same values as its emulated conversion; ``runner.checkers.compare`` checks
that on its first candidates and stops using the switchboard when any output differs by a bit.

Only models without If/Loop/Scan bodies, with less than ``MAP_BYTES`` of weights, get one
(``build_switchboard``): each converted weight is held again in its low-precision values. fp16 reads
"the low precision" below where the conversion is to bfloat16.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runner.errors import first_line
from runner.graph.convert import Converter
from runner.graph.emulate import tensor_types
from runner.graph.stubs import weightless
from runner.graph.weight_file import maps, weight_bytes

log = logging.getLogger(__name__)

#: the feeds of a switch: the node converted, the node kept in fp32
ON, OFF = np.array(True), np.array(False)


class Switchboard:
    """The switched model of one conversion and the feed of each switch.

    Attributes:
        model: the fp32 model, each switched node an ``If`` on its switch (graph inputs and outputs
            as the source model's, plus one bool scalar input per switch).
        switches: ``{node index in the source model: its switch's input name}``.
        key: a session key for this model (its source's fingerprint).
    """

    def __init__(self, model: onnx.ModelProto, switches: Dict[int, str], key: str):
        self.model, self.switches, self.key = model, switches, key

    def feeds(self, kept: FrozenSet[int]) -> Dict[str, np.ndarray]:
        """The switch feeds of the candidate keeping the nodes of indices ``kept`` in fp32.

        Args:
            kept: indices of the source model's nodes that stay fp32 (forced ones included).

        Returns:
            ``{switch input name: bool scalar array}``, every switch fed.
        """
        return {name: OFF if i in kept else ON for i, name in self.switches.items()}


def _cast_twice(x: str, out: str, low: int) -> List[onnx.NodeProto]:
    """``x`` rounded to the ONNX type ``low`` and back into ``out``: the emulation's rounding."""
    return [
        helper.make_node("Cast", [x], [out + "_low"], to=low),
        helper.make_node("Cast", [out + "_low"], [out], to=TensorProto.FLOAT),
    ]


def build_switchboard(model: onnx.ModelProto, converter: Converter, key: str) -> Optional[Switchboard]:
    """The switchboard of ``converter``'s candidates of ``model``, or None where it cannot be made.

    Args:
        model: the prepared fp32 model the converter converts (``runner.graph.convert.prepare``);
            not modified. Node indices of the switches are this model's.
        converter: its float16 or bfloat16 converter.
        key: the session key of the switched model.

    Returns:
        The switchboard; None (with a debug line) for a model with If/Loop/Scan bodies, weights past
        ``MAP_BYTES``, no node the conversion changes, or a switched node
        whose output has no known type or is an optional output left out before a present one.

    Raises:
        ModelError: the converter fails on the model.
    """
    why = _unsupported(model, converter)
    if why:
        log.debug("No switchboard: %s", why)
        return None
    converted = converter.convert([])
    typed = onnx.shape_inference.infer_shapes(weightless(converted)[0], strict_mode=False)
    low = tensor_types(typed)
    elem = converter.low.elem_type
    low_weights = {t.name: t for t in converted.graph.initializer if t.data_type == elem}
    as_converted = {n.name: n for n in typed.graph.node}
    types = tensor_types(converter.typed)
    board = onnx.ModelProto()
    board.CopyFrom(model)
    g = board.graph
    taken = {t for n in g.node for t in n.output} | {t.name for t in list(g.input) + list(g.initializer)}
    rounded_weights: Dict[str, str] = {}
    extra: List[TensorProto] = []
    switches: Dict[int, str] = {}
    nodes: List[onnx.NodeProto] = []
    for i, node in enumerate(g.node):
        twin = as_converted.get(node.name)
        if twin is None:
            nodes.append(node)
            continue
        rounds_in = [low.get(x) == elem for x in twin.input]
        rounds_out = [low.get(x) == elem for x in twin.output]
        if not any(rounds_in) and not any(rounds_out):
            nodes.append(node)  # the conversion leaves it as it is (an op it blocks, shape arithmetic)
            continue
        outputs = list(node.output)
        while outputs and not outputs[-1]:
            outputs.pop()
        if "" in outputs or any(types.get(o) is None for o in outputs):
            log.debug("No switchboard: node %s has an output of unknown type", node.name)
            return None
        switch = _fresh(f"switch__{i}", taken)
        converted_node, as_is = onnx.NodeProto(), onnx.NodeProto()
        converted_node.CopyFrom(node)
        as_is.CopyFrom(node)
        converted_node.name, as_is.name = f"{node.name}__low", f"{node.name}__fp32"
        then: List[onnx.NodeProto] = []
        for slot, x in enumerate(node.input):
            if not x or slot >= len(rounds_in) or not rounds_in[slot]:
                continue
            if x in low_weights:  # as the converter stores it (fp16: clipped), widened
                if x not in rounded_weights:
                    rounded_weights[x] = _fresh(f"{x}__low_values", taken)
                    values = numpy_helper.to_array(low_weights[x]).astype(np.float32)
                    extra.append(numpy_helper.from_array(values, rounded_weights[x]))
                converted_node.input[slot] = rounded_weights[x]
            else:
                converted_node.input[slot] = _fresh(f"{x}__rounded_{i}_{slot}", taken)
                then.extend(_cast_twice(x, converted_node.input[slot], elem))
        then.append(converted_node)
        then_out, else_out = [], []
        for j, out in enumerate(outputs):
            result = _fresh(f"{out}__switched_low", taken)
            if j < len(rounds_out) and rounds_out[j]:
                converted_node.output[j] = _fresh(f"{out}__switched_fp32", taken)
                then.extend(_cast_twice(converted_node.output[j], result, elem))
            else:
                converted_node.output[j] = result
            as_is.output[j] = _fresh(f"{out}__switched_as_is", taken)
            then_out.append(helper.make_tensor_value_info(result, types[out], None))
            else_out.append(helper.make_tensor_value_info(as_is.output[j], types[out], None))
        switches[i] = switch
        nodes.append(
            helper.make_node(
                "If",
                [switch],
                outputs,
                name=_fresh(f"{node.name}__switch", taken),
                then_branch=helper.make_graph(then, f"{node.name}__converted", [], then_out),
                else_branch=helper.make_graph([as_is], f"{node.name}__kept", [], else_out),
            )
        )
    if not switches:
        log.debug("No switchboard: the conversion changes no node")
        return None
    del g.node[:]
    g.node.extend(nodes)
    g.input.extend(helper.make_tensor_value_info(name, TensorProto.BOOL, []) for name in switches.values())
    g.initializer.extend(extra)
    del g.value_info[:]  # the session infers them; the branches renamed what some describe
    return Switchboard(board, switches, key)


def _unsupported(model: onnx.ModelProto, converter: Converter) -> str:
    """Why ``model`` gets no switchboard ("" when it does)."""
    if converter.flow:
        return "the model has If/Loop/Scan bodies"
    if maps(weight_bytes(model)):
        return "its weights would be held again in low-precision values"
    return ""


def _fresh(name: str, taken: set) -> str:
    """``name``, or it with a number, not yet in ``taken`` (then taken)."""
    out, k = name, 0
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    taken.add(out)
    return out


class LazySwitchboard:
    """A switchboard built on first use, once, by whichever thread asks first.

    Args:
        model, converter, key: as ``build_switchboard``'s.
    """

    def __init__(self, model: onnx.ModelProto, converter: Converter, key: str):
        self._args = (model, converter, key)
        self._lock = threading.Lock()
        self._built = False
        self._board: Optional[Switchboard] = None

    def get(self) -> Optional[Switchboard]:
        """The switchboard, or None where ``build_switchboard`` makes none or fails (the candidates are
        then built one by one, and their own builds say what fails)."""
        with self._lock:
            if not self._built:
                try:
                    self._board = build_switchboard(*self._args)
                except Exception as e:  # the converter or shape inference: never the run's end
                    log.info("No switchboard (%s: %s); each candidate is built", type(e).__name__, first_line(e))
                self._built = True
                self._args = None  # type: ignore[assignment]
        return self._board

    def __getstate__(self) -> Dict[str, object]:
        """Pickled as one that makes none: the switched model stays in the process of its search."""
        return {"_args": None, "_built": True, "_board": None}

    def __setstate__(self, state: Dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


@dataclass(frozen=True)
class Switched:
    """A candidate as one feed set of its search's switchboard.

    Attributes:
        board: the search's switchboard (built on first use).
        kept: indices of the nodes the candidate keeps in fp32 (forced ones included).
    """

    board: LazySwitchboard
    kept: FrozenSet[int]
