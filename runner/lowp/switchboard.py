"""One fp32 model that runs every candidate of a precision search, each node switched by a feed.

A precision search checks many candidates of one model, each the model in a low precision except a
kept set of nodes. Building, validating and loading each candidate in a new ONNX Runtime session
costs several times its run on a model of a few hundred nodes. A switchboard is built once: every
node the low precision changes is wrapped in an ``If`` on a bool scalar input of its own, whose
``then`` branch is the node as the low precision computes it and whose ``else`` branch is the node
as it is. One session then runs any candidate by its feeds: ``True`` for a converted node, ``False``
for a kept one (``Switchboard.feeds``). A switchboard for a device's provider holds both forms side by side
instead, and a ``Where`` on the switch picks one (``Wiring``'s ``inline``).

This module holds what every switchboard shares: the switched model (``Switchboard``), the wiring of
its switches (``Wiring``), its build on first use (``LazySwitchboard``) and a candidate's feed set
(``Switched``). ``runner.lowp.fp16_switchboard`` builds fp16's and bf16's (the emulation's rounding
written into each branch); ``runner.lowp.qdq_switchboard`` builds int8's (each node TensorRT's
placement quantizes reading its Q/DQ). ``runner.checkers.compare.switched`` runs them and checks that they
give the candidates' own bits.

Only models without If/Loop/Scan bodies and with less than ``MAP_BYTES`` of weights get one
(``unsupported``): each switched weight is held again in its low-precision form.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from runner.errors import first_line
from runner.graph.isolate import has_body
from runner.graph.weight_file import maps, weight_bytes

log = logging.getLogger(__name__)

#: the feeds of a switch: the node converted, the node kept in fp32
ON, OFF = np.array(True), np.array(False)


class RunsOn(Enum):
    """The checker backend that gives each candidate's own values when it runs a switched model as written."""

    #: fp16/bf16: an emulation backend (``runner.backends.fp16_emulation``), whose rounding the model holds
    EMULATION = "emulation"
    #: int8 QDQ: ONNX Runtime (``runner.backends.onnxruntime``) on its CPU provider, which runs the candidates' Q/DQ
    #: as written
    ONNXRUNTIME = "onnxruntime"
    #: fp16/bf16 natively: ONNX Runtime on a device's provider (CUDA's), whose kernels compute each converted node
    #: in the low precision as the candidate does (the CPU provider computes in fp32 the runs of nodes it has no
    #: fp16 kernels for, so a candidate and its switched run differ there)
    DEVICE = "device"


class Switchboard:
    """The switched model of one conversion and the feed of each switch.

    Attributes:
        model: the fp32 model, each switched node an ``If`` on its switch (a native switchboard's: both forms and
            a ``Where`` on it; graph inputs and outputs as the source model's, plus one bool scalar input per
            switch).
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


def cast_twice(x: str, out: str, low: int) -> List[onnx.NodeProto]:
    """``x`` rounded to the ONNX type ``low`` and back into ``out``: the emulation's rounding."""
    return [
        helper.make_node("Cast", [x], [out + "_low"], to=low),
        helper.make_node("Cast", [out + "_low"], [out], to=TensorProto.FLOAT),
    ]


class Wiring:
    """The switches of one switched model: fresh tensor names, and each switched node's two forms and its switch.

    Args:
        graph: the source model's graph (its names are taken).
        types: the element type of each tensor of the source model (``runner.lowp.emulate.tensor_types``).
        inline: each switched node's two forms side by side in the graph, a ``Where`` on the switch picking one
            (for a device's provider, where an ``If`` costs more than the node: ONNX Runtime's CUDA provider gives
            each ``If`` body a stream and cuBLAS handle of its own, and a 0.5B decoder's 1,628 switches ran an
            H200 out of memory: ``CUBLAS failure 3`` in ``cublasCreate``, measured); False: an ``If`` whose
            branches hold the forms, so that only the switched-on one runs.

    Attributes:
        switches: ``{node index: its switch's input name}`` of the nodes switched so far.
    """

    def __init__(self, graph: onnx.GraphProto, types: Dict[str, int], inline: bool = False):
        self.types, self.inline = types, inline
        self.taken = {t for n in graph.node for t in n.output} | {
            t.name for t in list(graph.input) + list(graph.initializer)
        }
        self.switches: Dict[int, str] = {}

    def fresh(self, name: str) -> str:
        """``name``, or it with a number, not yet taken in the model (then taken)."""
        out, k = name, 0
        while out in self.taken:
            k += 1
            out = f"{name}_{k}"
        self.taken.add(out)
        return out

    def can_switch(self, node: onnx.NodeProto) -> bool:
        """Whether ``node``'s outputs can be an ``If``'s: each of known type, no optional output left
        out before a present one."""
        outputs = _present(node)
        return "" not in outputs and all(self.types.get(o) is not None for o in outputs)

    def switch(
        self,
        i: int,
        node: onnx.NodeProto,
        then: List[onnx.NodeProto],
        inputs: Dict[int, str],
        rounds_out: Sequence[bool] = (),
        low: int = TensorProto.FLOAT16,
        form: Optional[onnx.NodeProto] = None,
    ) -> List[onnx.NodeProto]:
        """``node`` (index ``i``; ``can_switch``) switched between its converted form and itself.

        Args:
            then: nodes the converted form computes first (its inputs' rounding or Q/DQ), reading
                the outer graph's tensors.
            inputs: ``{input position: the tensor the converted form reads there}``.
            rounds_out: per output, whether the converted form rounds it to ``low`` (an ONNX type).
            form: the converted node itself when it is not ``node`` (a native switchboard's: the node as the
                conversion writes it, computing in ``low``); its outputs flagged in ``rounds_out`` are of
                type ``low`` and are widened to fp32 (one Cast), not rounded.

        Returns:
            The nodes writing ``node``'s outputs, reading a new bool scalar input (``switches[i]``): one ``If``,
            or (``inline``) the converted form's nodes, the node as it is and a ``Where`` per output (both forms
            run on every candidate; ``Where`` copies the switched-on one's values exactly).
        """
        outputs = _present(node)
        converted, as_is = onnx.NodeProto(), onnx.NodeProto()
        converted.CopyFrom(node if form is None else form)
        as_is.CopyFrom(node)
        converted.name, as_is.name = f"{node.name}__low", f"{node.name}__fp32"
        for slot, name in inputs.items():
            converted.input[slot] = name
        then = [*then, converted]
        results: List[str] = []  # each output's converted value
        for j, out in enumerate(outputs):
            results.append(self.fresh(f"{out}__switched_low"))
            if j < len(rounds_out) and rounds_out[j] and form is not None:
                converted.output[j] = self.fresh(f"{out}__switched_in_low")
                then.append(helper.make_node("Cast", [converted.output[j]], [results[j]], to=TensorProto.FLOAT))
            elif j < len(rounds_out) and rounds_out[j]:
                converted.output[j] = self.fresh(f"{out}__switched_fp32")
                then.extend(cast_twice(converted.output[j], results[j], low))
            else:
                converted.output[j] = results[j]
            as_is.output[j] = self.fresh(f"{out}__switched_as_is")
        switch = self.switches[i] = self.fresh(f"switch__{i}")
        if self.inline:
            picks = [
                self._pick(switch, a, b, out, f"{node.name}__select_{j}")
                for j, (a, b, out) in enumerate(zip(results, as_is.output, outputs))
            ]
            return [*then, as_is, *(n for pick in picks for n in pick)]

        def declared(names: Sequence[str]) -> List[onnx.ValueInfoProto]:
            return [helper.make_tensor_value_info(t, self.types[o], None) for t, o in zip(names, outputs)]

        return [
            helper.make_node(
                "If",
                [switch],
                outputs,
                name=self.fresh(f"{node.name}__switch"),
                then_branch=helper.make_graph(then, f"{node.name}__converted", [], declared(results)),
                else_branch=helper.make_graph([as_is], f"{node.name}__kept", [], declared(as_is.output)),
            )
        ]

    def _pick(self, switch: str, low: str, kept: str, out: str, name: str) -> List[onnx.NodeProto]:
        """``out`` = ``low`` where ``switch`` is on, else ``kept``: a ``Where``, or for bool tensors (ONNX
        Runtime's CPU provider has no bool ``Where``: NOT_IMPLEMENTED) ``(switch and low) or (not switch and
        kept)``."""
        name = self.fresh(name)
        if self.types[out] != TensorProto.BOOL:
            return [helper.make_node("Where", [switch, low, kept], [out], name=name)]
        on, off, rest = self.fresh(f"{name}_on"), self.fresh(f"{name}_off"), self.fresh(f"{name}_kept")
        return [
            helper.make_node("And", [switch, low], [on], name=on),
            helper.make_node("Not", [switch], [off], name=off),
            helper.make_node("And", [off, kept], [rest], name=rest),
            helper.make_node("Or", [on, rest], [out], name=name),
        ]

    def finish(
        self, board: onnx.ModelProto, nodes: List[onnx.NodeProto], weights: Sequence[TensorProto], key: str
    ) -> Switchboard:
        """``board`` (a copy of the source model) with ``nodes`` as its nodes, the switches as inputs
        and ``weights`` (what the converted forms read) as initializers: the switchboard keyed ``key``."""
        g = board.graph
        del g.node[:]
        g.node.extend(nodes)
        g.input.extend(helper.make_tensor_value_info(name, TensorProto.BOOL, []) for name in self.switches.values())
        g.initializer.extend(weights)
        del g.value_info[:]  # the session infers them; the branches renamed what some describe
        return Switchboard(board, self.switches, key)


def _present(node: onnx.NodeProto) -> List[str]:
    """``node``'s outputs, optional ones left out at the end dropped."""
    outputs = list(node.output)
    while outputs and not outputs[-1]:
        outputs.pop()
    return outputs


def unsupported(model: onnx.ModelProto, any_size: bool = False) -> str:
    """Why ``model`` gets no switchboard ("" when it does): bodies, or weights past ``MAP_BYTES`` (unless
    ``any_size``: a switchboard whose weights are mapped from the weight file)."""
    if any(has_body(n) for n in model.graph.node):
        return "the model has If/Loop/Scan bodies"
    if not any_size and maps(weight_bytes(model)):
        return "its weights would be held again in their low-precision form"
    return ""


@dataclass(frozen=True)
class Switched:
    """A candidate as one feed set of its search's switchboard (``Candidate.switched``).

    Attributes:
        board: the search's switchboard, built on first use.
        kept: indices of the nodes the candidate keeps in fp32 (forced ones included).
    """

    board: LazySwitchboard
    kept: FrozenSet[int]


class LazySwitchboard:
    """A search's switchboards, each built on first use, once, by whichever thread asks first.

    Args:
        build: makes the switchboard (``build_switchboard``, ``runner.lowp.qdq_switchboard``), or None.
        runs_on: the checker backend that runs its candidates as themselves.
        native: makes a second switchboard, one ONNX Runtime runs as written on a device (``RunsOn.DEVICE``:
            fp16's native switchboard, ``build_switchboard(native=True)``), or None.

    Attributes:
        runs_on: the kind ``get()`` gives by default.
        offers: the kinds it can give.
    """

    def __init__(
        self,
        build: Callable[[], Optional[Switchboard]],
        runs_on: RunsOn = RunsOn.EMULATION,
        native: Optional[Callable[[], Optional[Switchboard]]] = None,
    ):
        self._builds: Dict[RunsOn, Callable[[], Optional[Switchboard]]] = {runs_on: build}
        if native is not None:
            self._builds[RunsOn.DEVICE] = native
        self.runs_on = runs_on
        self.offers: FrozenSet[RunsOn] = frozenset(self._builds)
        self._lock = threading.Lock()
        self._boards: Dict[RunsOn, Optional[Switchboard]] = {}

    def get(self, runs: Optional[RunsOn] = None) -> Optional[Switchboard]:
        """The switchboard of kind ``runs`` (None: ``runs_on``), or None where its build makes none or fails, or
        none of that kind is offered (the candidates are then built one by one, and their own builds say what
        fails)."""
        kind = self.runs_on if runs is None else runs
        with self._lock:
            if kind not in self._boards:
                build = self._builds.pop(kind, None)
                board = None
                if build is not None:
                    try:
                        board = build()
                    except Exception as e:  # the converter or shape inference: never the run's end
                        log.info("No switched model (%s: %s); each candidate is built", type(e).__name__, first_line(e))
                self._boards[kind] = board
        return self._boards[kind]

    def __getstate__(self) -> Dict[str, object]:
        """Pickled as one that makes none: the switched models stay in the process of their search."""
        return {
            "_builds": {},
            "runs_on": self.runs_on,
            "offers": self.offers,
            "_boards": {kind: None for kind in self.offers},
        }

    def __setstate__(self, state: Dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
