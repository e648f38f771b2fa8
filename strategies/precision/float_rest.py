"""int8 with the rest in fp16 (``quantization.float_precision=float16``): a precision search in two stages.

TensorRT's ``--int8 --fp16`` runs every node outside int8 in fp16. Its answer has three parts: the
nodes in int8, the nodes kept out of int8 (which run in fp16), and the nodes that need fp32. The run
finds them in two stages, both over candidates checked as written:

1. **fp16** first: the fewest float nodes to keep in fp32 with every other node in fp16 and none in
   int8 (``runner.lowp.convert``). The all-fp16 candidate is checked first (it often passes: the
   stage then costs one check); otherwise a search of the run's marker runs over the float nodes
   ranked by the error each introduces in fp16 (``runner.layerwise.ranking``, made only then).
   fp16 breaks at a few nodes (an overflow, a weight past 65504) and costs little elsewhere, so this
   stage finds those nodes and leaves int8 nearly the whole tolerance.
2. **int8**, the search of ``low_precision=int8`` as it is (its gates, ranking and exchange), with
   those nodes in fp32 and every node outside int8 in fp16 (``runner.lowp.mixed_qdq``): the fewest
   nodes kept out of int8, judged in the arithmetic TensorRT deploys. Nothing in int8 is the first
   stage's answer, which passed: the search's premise holds.

Deciding int8 first in fp32 would let it take the whole tolerance, and fp16 would then need most
nodes in fp32 (the detector at rel L2 0.08: 180 of 330).

Both stages name candidates by sets of node indices: ``i`` says node i is out of int8, and
``offset + j`` says node j is in fp32 (``offset``: the model's node count). An int8-stage set holds
the fp16 stage's answer, and the key of a candidate carries its stage (``variant``), so no verdict
of one stage stands for the other's.
"""

from __future__ import annotations

import logging
from typing import Callable, FrozenSet, Iterable, List, Optional, Set, Tuple

import onnx

from runner.lowp.convert import Converter
from runner.lowp.mixed_qdq import MixedQuantizer
from runner.lowp.precisions import FLOAT16

log = logging.getLogger(__name__)

Units = FrozenSet[int]


class FloatRest:
    """The stages of an int8 search with the rest in fp16: what their candidates hold and how they are built.

    Args:
        mixed: builds the int8 candidates with the rest in fp16 (``MixedQuantizer``).
        model: the prepared fp32 model (opset 19), whose node indices the units are.
        layers: indices of the float nodes the fp16 stage may keep in fp32, in topological order.
        forced: indices of nodes outside the scope: fp32 (and out of int8) in every candidate.
        ranking: ranks ``layers`` by the error each introduces in fp16, largest first (called once,
            when the all-fp16 candidate fails).

    Attributes:
        fp32: the fp16 stage's answer (nodes kept in fp32) once the int8 stage started, else None.
        offset: what a node index is shifted by to say "kept in fp32" (the model's node count).
    """

    def __init__(
        self,
        mixed: MixedQuantizer,
        model: onnx.ModelProto,
        layers: Iterable[int],
        forced: Iterable[int],
        ranking: Callable[[], List[int]],
    ):
        self.mixed, self.model, self.layers, self.forced = mixed, model, list(layers), frozenset(forced)
        self._ranking = ranking
        self.offset = len(model.graph.node)
        self.fp32: Optional[Units] = None
        self._converter: Optional[Converter] = None

    @property
    def stage(self) -> str:
        """ "float16" while the fp16 stage runs, then "int8"."""
        return "float16" if self.fp32 is None else "int8"

    def start_int8(self, fp32_units: Units) -> None:
        """End the fp16 stage with its answer (a set of its units) and start the int8 stage."""
        self.fp32 = self.split(fp32_units)[1]
        log.info(
            "float16 stage done (%d of %d float nodes in float32); now the fewest nodes to keep out of int8, "
            "with the rest in float16",
            len(self.fp32),
            len(self.layers),
        )

    def encode(self, fp32: Iterable[int]) -> List[int]:
        """Node indices as "kept in fp32" units (``offset + j``)."""
        return [self.offset + j for j in fp32]

    def order(self) -> List[int]:
        """The fp16 stage's units, most likely needed in fp32 first."""
        return self.encode(self._ranking())

    def elements(self) -> List[int]:
        """The fp16 stage's units in topological order (a search's stand-in before the ranking)."""
        return self.encode(self.layers)

    def closure(self, units: Units) -> Units:
        """A set of the int8 stage with the fp16 stage's answer; a set of the fp16 stage as it is."""
        return units if self.fp32 is None else units | frozenset(self.encode(self.fp32))

    def split(self, units: Iterable[int]) -> Tuple[Units, Units]:
        """(nodes out of int8, nodes kept in fp32) of a unit set."""
        out: Set[int] = set()
        fp32: Set[int] = set()
        for u in units:
            if u >= self.offset:
                fp32.add(u - self.offset)
            else:
                out.add(u)
        return frozenset(out), frozenset(fp32)

    def node_of(self, unit: int) -> int:
        """The node index a unit names."""
        return unit - self.offset if unit >= self.offset else unit

    def convert(self, units: Units) -> onnx.ModelProto:
        """The candidate of a unit set: in the fp16 stage the fp16 conversion keeping its nodes in fp32
        (nothing in int8); in the int8 stage ``MixedQuantizer.convert``.

        Raises:
            ModelError: the quantizer or the float16 converter fails on the model.
        """
        out, fp32 = self.split(units)
        nodes = self.model.graph.node
        kept = sorted(nodes[j].name for j in fp32 | self.forced)
        if self.fp32 is None:
            return self.converter().convert(kept)
        return self.mixed.convert(sorted(nodes[i].name for i in out | self.forced), kept)

    def converter(self) -> Converter:
        """The fp16 converter of the fp32 model (made once: the fp16 stage's candidates and its ranking share it).

        Raises:
            ModelError: bfloat16 below opset 13 (never for fp16).
        """
        if self._converter is None:
            self._converter = Converter(self.model, FLOAT16)
        return self._converter

    def blocked(self) -> Set[int]:
        """Float nodes the fp16 converter never converts (op types without fp16 kernels): fp32 always."""
        return self.mixed.blocked(self.model, self.layers)
