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
candidate computes the same values as its emulated conversion; ``runner.checkers.switched`` checks
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
        The switchboard; None (with a log line) for a model with If/Loop/Scan bodies, weights past
        ``MAP_BYTES``, no node the conversion changes, or a switched node
        whose output has no known type or is an optional output left out before a present one.

    Raises:
        ModelError: the converter fails on the model.
    """
    why = _unsupported(model, converter)
    if why:
        log.info("No switched model: %s; each candidate is built", why)
        return None
    board = onnx.ModelProto()
    board.CopyFrom(model)
    g = board.graph
    wrapper = _Wrapper(converter, g)
    nodes: List[onnx.NodeProto] = []
    for i, node in enumerate(g.node):
        wrapped = wrapper.wrap(i, node)
        if wrapped is None:
            log.info("No switched model: node %s has an output of unknown type; each candidate is built", node.name)
            return None
        nodes.append(wrapped)
    if not wrapper.switches:
        log.info("No switched model: the conversion changes no node")
        return None
    del g.node[:]
    g.node.extend(nodes)
    g.input.extend(helper.make_tensor_value_info(name, TensorProto.BOOL, []) for name in wrapper.switches.values())
    g.initializer.extend(wrapper.weights)
    del g.value_info[:]  # the session infers them; the branches renamed what some describe
    return Switchboard(board, wrapper.switches, key)


class _Wrapper:
    """Wraps each node the conversion changes in its ``If`` (``wrap``), learning what it rounds from
    the converter's output with no node kept.

    Attributes:
        switches: ``{node index: its switch's input name}`` of the nodes wrapped so far.
        weights: the low-precision values of the weights converted nodes read (fp32 initializers).
    """

    def __init__(self, converter: Converter, graph: onnx.GraphProto):
        converted = converter.convert([])
        typed = onnx.shape_inference.infer_shapes(weightless(converted)[0], strict_mode=False)
        self.converted_types = tensor_types(typed)
        self.twins = {n.name: n for n in typed.graph.node}
        self.elem = converter.low.elem_type
        self.low_weights = {t.name: t for t in converted.graph.initializer if t.data_type == self.elem}
        self.types = tensor_types(converter.typed)  # the fp32 model's
        self.taken = {t for n in graph.node for t in n.output} | {
            t.name for t in list(graph.input) + list(graph.initializer)
        }
        self.switches: Dict[int, str] = {}
        self.weights: List[TensorProto] = []
        self._rounded_weights: Dict[str, str] = {}

    def wrap(self, i: int, node: onnx.NodeProto) -> Optional[onnx.NodeProto]:
        """``node`` (index ``i``) as it is when the conversion leaves it so, else its ``If``; None when
        an output has no known type or an optional output is left out before a present one."""
        twin = self.twins.get(node.name)
        if twin is None:
            return node
        rounds_in = [self.converted_types.get(x) == self.elem for x in twin.input]
        rounds_out = [self.converted_types.get(x) == self.elem for x in twin.output]
        if not any(rounds_in) and not any(rounds_out):
            return node  # the conversion leaves it as it is (an op it blocks, shape arithmetic)
        outputs = list(node.output)
        while outputs and not outputs[-1]:
            outputs.pop()
        if "" in outputs or any(self.types.get(o) is None for o in outputs):
            return None
        converted, as_is = onnx.NodeProto(), onnx.NodeProto()
        converted.CopyFrom(node)
        as_is.CopyFrom(node)
        converted.name, as_is.name = f"{node.name}__low", f"{node.name}__fp32"
        then: List[onnx.NodeProto] = []
        for slot, x in enumerate(node.input):
            if x and slot < len(rounds_in) and rounds_in[slot]:
                converted.input[slot] = self._rounded_input(x, f"{x}__rounded_{i}_{slot}", then)
        then.append(converted)
        then_out, else_out = [], []
        for j, out in enumerate(outputs):
            result = self._fresh(f"{out}__switched_low")
            if j < len(rounds_out) and rounds_out[j]:
                converted.output[j] = self._fresh(f"{out}__switched_fp32")
                then.extend(_cast_twice(converted.output[j], result, self.elem))
            else:
                converted.output[j] = result
            as_is.output[j] = self._fresh(f"{out}__switched_as_is")
            then_out.append(helper.make_tensor_value_info(result, self.types[out], None))
            else_out.append(helper.make_tensor_value_info(as_is.output[j], self.types[out], None))
        self.switches[i] = self._fresh(f"switch__{i}")
        return helper.make_node(
            "If",
            [self.switches[i]],
            outputs,
            name=self._fresh(f"{node.name}__switch"),
            then_branch=helper.make_graph(then, f"{node.name}__converted", [], then_out),
            else_branch=helper.make_graph([as_is], f"{node.name}__kept", [], else_out),
        )

    def _rounded_input(self, x: str, name: str, then: List[onnx.NodeProto]) -> str:
        """What a converted node reads for ``x``: a weight as the converter stores it (fp16: clipped),
        widened, else ``x`` rounded in the branch (its Casts appended to ``then``)."""
        if x in self.low_weights:
            if x not in self._rounded_weights:
                self._rounded_weights[x] = self._fresh(f"{x}__low_values")
                values = numpy_helper.to_array(self.low_weights[x]).astype(np.float32)
                self.weights.append(numpy_helper.from_array(values, self._rounded_weights[x]))
            return self._rounded_weights[x]
        rounded = self._fresh(name)
        then.extend(_cast_twice(x, rounded, self.elem))
        return rounded

    def _fresh(self, name: str) -> str:
        """``name``, or it with a number, not yet taken in the model (then taken)."""
        out, k = name, 0
        while out in self.taken:
            k += 1
            out = f"{name}_{k}"
        self.taken.add(out)
        return out


def _unsupported(model: onnx.ModelProto, converter: Converter) -> str:
    """Why ``model`` gets no switchboard ("" when it does)."""
    if converter.flow:
        return "the model has If/Loop/Scan bodies"
    if maps(weight_bytes(model)):
        return "its weights would be held again in low-precision values"
    return ""


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
                    log.info("No switched model (%s: %s); each candidate is built", type(e).__name__, first_line(e))
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
