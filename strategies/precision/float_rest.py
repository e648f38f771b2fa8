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
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, cast

import onnx

from runner.lowp.convert import Converter
from runner.lowp.makers import CastMaker, MixedMaker
from runner.lowp.precisions import FLOAT16
from strategies.boundary import BoundaryMarker
from strategies.onnx_search import Search
from strategies.precision.deferred_search import DeferredSearch
from strategies.precision.search import ranked_search
from strategies.precision.stages import Stage, Units

log = logging.getLogger(__name__)


class FloatRest(Stage):
    """The stages of an int8 search with the rest in fp16: what their candidates hold and how they are built.

    Args:
        mixed: builds the int8 candidates with the rest in fp16 (``runner.lowp.makers.MixedMaker``).
        model: the prepared fp32 model (opset 19), whose node indices the units are.
        layers: indices of the nodes the int8 stage may keep out of int8, in topological order.
        float_layers: indices of the float nodes the fp16 stage may keep in fp32, in topological order.
        forced: indices of nodes outside the scope: fp32 (and out of int8) in every candidate.
        ranking: ranks ``float_layers`` by the error each introduces in fp16, largest first (called once,
            when the all-fp16 candidate fails).

    Attributes:
        fp32: the fp16 stage's answer (nodes kept in fp32) once the int8 stage started, else None.
        offset: what a node index is shifted by to say "kept in fp32" (the model's node count).
    """

    def __init__(
        self,
        mixed: MixedMaker,
        model: onnx.ModelProto,
        layers: Iterable[int],
        float_layers: Iterable[int],
        forced: Iterable[int],
        ranking: Callable[[], List[int]],
    ):
        super().__init__(model, layers, forced)
        self.mixed, self.float_layers = mixed, list(float_layers)
        self._ranking = ranking
        self.offset = len(model.graph.node)
        self.fp32: Optional[Units] = None
        self._cast: Optional[CastMaker] = None

    @property
    def stage(self) -> str:
        """ "float16" while the fp16 stage runs, then "int8"."""
        return "float16" if self.fp32 is None else "int8"

    @property
    def first_of_two(self) -> bool:  # type: ignore[override]
        """While the fp16 stage runs."""
        return self.fp32 is None

    def next_stage(self, answer: Units) -> bool:
        """End the fp16 stage with its answer (a set of its units) and start the int8 stage; False once in it."""
        if self.fp32 is not None:
            return False
        self.fp32 = self.split(answer)[1]
        log.info(
            "float16 stage done (%d of %d float nodes in float32); now the fewest nodes to keep out of int8, "
            "with the rest in float16",
            len(self.fp32),
            len(self.float_layers),
        )
        return True

    def encode(self, fp32: Iterable[int]) -> List[int]:
        """Node indices as "kept in fp32" units (``offset + j``)."""
        return [self.offset + j for j in fp32]

    def order(self) -> List[int]:
        """The fp16 stage's units, most likely needed in fp32 first."""
        return self.encode(self._ranking())

    def elements(self) -> List[int]:
        """The fp16 stage's units in topological order (a search's stand-in before the ranking)."""
        return self.encode(self.float_layers)

    def closure(self, units: Units) -> Units:
        """A set of the int8 stage with the fp16 stage's answer; a set of the fp16 stage as it is."""
        return units if self.fp32 is None else units | frozenset(self.encode(self.fp32))

    def everything(self) -> Units:
        """Every float node kept in fp32, none in int8 (the all-fp32 gate's set, in either stage)."""
        return frozenset(self.encode(self.float_layers))

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

    def nodes(self, units: Iterable[int]) -> Set[int]:
        """The node a unit names, for each unit."""
        return {u - self.offset if u >= self.offset else u for u in units}

    def kept(self, final: Units) -> Units:
        """The nodes out of int8 of an answer."""
        return self.split(final)[0]

    def convert(self, units: Units) -> onnx.ModelProto:
        """The candidate of a unit set: in the fp16 stage the fp16 conversion keeping its nodes in fp32
        (nothing in int8); in the int8 stage ``MixedMaker.candidate_with``.

        Raises:
            ModelError: the quantizer or the float16 converter fails on the model.
        """
        out, fp32 = self.split(units)
        kept = self.names(fp32 | self.forced)
        if self.fp32 is None:
            return self.cast().candidate(kept)
        return self.mixed.candidate_with(self.names(out | self.forced), kept)

    def cast(self) -> CastMaker:
        """The fp16 maker of the fp32 model (made once: the fp16 stage's candidates and its ranking share it).

        Raises:
            ModelError: bfloat16 below opset 13 (never for fp16).
        """
        if self._cast is None:
            self._cast = CastMaker(Converter(self.model, FLOAT16))
        return self._cast

    def size(self, units: Units) -> str:
        """How many nodes are in fp32, and (in the int8 stage) how many out of int8."""
        out, fp32 = self.split(units)
        where = f"{len(fp32)} of {len(self.float_layers)} float nodes in float32, the rest float16"
        if self.fp32 is None:
            return f"{where}, none in int8"
        return f"{len(out)} of {len(self.layers)} nodes out of int8; {where}"

    def step(self, units: Units) -> str:
        return f"the {self.stage} stage's conversion keeping {self.size(units)}"

    def info(self, units: Units) -> Dict[str, Any]:
        """Kept out of int8 (every node in the fp16 stage), total, ``fp32`` and the stage."""
        out, fp32 = self.split(units)
        kept = len(self.layers) if self.fp32 is None else len(out)
        return {"kept": kept, "total": len(self.layers), "fp32": len(fp32), "stage": self.stage}

    def variant(self) -> str:
        """The stage: no verdict of one stage stands for the other's."""
        return f":{self.stage}-stage"

    def blocked(self) -> Set[int]:
        """Float nodes the fp16 converter never converts (op types without fp16 kernels): fp32 always."""
        return self.mixed.blocked(self.float_layers)

    def everything_size(self) -> str:
        return "every node in float32"

    def first_search(self, marker: Callable[[int], BoundaryMarker], direction: str) -> Optional[Search]:
        """The fp16 stage's search: over the float nodes ranked by the error each introduces in fp16 (made when the
        search is first used) for a ranked search, else in topological order (``direction=reverse``: from the
        outputs)."""
        stand_in = ranked_search(self.elements(), marker)
        if direction == "ranked":
            return cast(Search, DeferredSearch(lambda: ranked_search(self.order(), marker), stand_in))
        return ranked_search(self.elements()[:: -1 if direction == "reverse" else 1], marker)

    def facts(self, final: Units, describe: Callable[[Iterable[int]], List[Dict[str, str]]]) -> Dict[str, Any]:
        """``float_precision``, ``fp16_nodes`` (kept out of int8, in fp16), ``fp32_nodes`` (in float32: shown
        needed by the search, or outside the scope) and ``fp32_always`` (op types the fp16 converter never
        converts)."""
        out, fp32 = self.split(final)
        fp32 = fp32 | self.forced
        return {
            "float_precision": "float16",
            "fp16_nodes": describe(out - fp32),
            "fp32_nodes": describe(fp32),
            "fp32_always": describe(self.blocked() - fp32),
        }
