"""What a precision search's unit sets mean, stage by stage: the one interface the strategy asks.

A unit set is a set of node indices of the prepared model. In a run of one stage (fp16, bf16, int8, fp8, a
given quantized model) unit ``i`` says "node i is kept out of the low precision", and the candidate maker
(``runner.lowp.makers``) builds the model. int8 with the rest in fp16 runs two stages over one numbering
(``strategies.precision.float_rest.FloatRest``: units past an offset say "kept in fp32"). The strategy never
asks which it holds: it asks a ``Stage`` for the candidate of a set, its size, its facts, its key's variant,
the set it closes to, and whether a second stage follows.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Set

import onnx

from runner.lowp.makers import CandidateMaker
from runner.lowp.switchboard import LazySwitchboard, Switched
from strategies.boundary import BoundaryMarker
from strategies.onnx_search import Search

Units = FrozenSet[int]


class Stage(abc.ABC):
    """What one stage's unit sets mean (module docstring).

    Attributes:
        model: the prepared fp32 model whose node indices the units are.
        layers: indices of the nodes the (int8, or only) stage may keep, in topological order.
        forced: indices of nodes outside the scope, kept in every candidate.
    """

    def __init__(self, model: onnx.ModelProto, layers: Iterable[int], forced: Iterable[int]):
        self.model, self.layers, self.forced = model, list(layers), frozenset(forced)

    #: the first stage of two (fp16 before int8): its search has no gates of int8's, no trade-off points
    first_of_two = False

    def names(self, units: Iterable[int]) -> List[str]:
        """The node names of node indices ``units``, sorted."""
        return sorted(self.model.graph.node[i].name for i in units)

    @abc.abstractmethod
    def convert(self, units: Units) -> onnx.ModelProto:
        """The candidate of a unit set.

        Raises:
            ModelError: the maker fails on the model.
        """

    @abc.abstractmethod
    def size(self, units: Units) -> str:
        """A candidate's size for its label ("3 of 146 nodes out of int8")."""

    @abc.abstractmethod
    def step(self, units: Units) -> str:
        """What builds a unit set's model, for the message when it is invalid."""

    @abc.abstractmethod
    def info(self, units: Units) -> Dict[str, Any]:
        """A candidate's facts for the iteration info file: kept and total (and, with two stages, more)."""

    def nodes(self, units: Iterable[int]) -> Set[int]:
        """The node indices a unit set names (default: the units themselves)."""
        return set(units)

    def kept(self, final: Units) -> Units:
        """The nodes of an answer kept out of the low precision (``kept_nodes``)."""
        return final

    def variant(self) -> str:
        """What besides the low precision the candidates' keys carry (default nothing)."""
        return ""

    def closure(self, units: Units) -> Units:
        """The unit set a search set is checked as (default: itself)."""
        return units

    def everything(self) -> Units:
        """The unit set with every node kept (the all-fp32 gate's)."""
        return frozenset(self.layers)

    def everything_size(self) -> str:
        """How the all-fp32 gate's candidate reads in its label."""
        return self.size(self.everything())

    def first_search(self, marker: Callable[[int], BoundaryMarker], direction: str) -> Optional[Search]:
        """The search of a stage before the low precision's own (fp16 before int8), or None (default)."""
        return None

    def switched(self, units: Units) -> Optional[Switched]:
        """The candidate as feeds of the stage's switchboard, or None where it has none."""
        return None

    def next_stage(self, answer: Units) -> bool:
        """Start the next stage from this one's answer; False when there is none (default)."""
        return False

    def facts(self, final: Units, describe: Callable[[Iterable[int]], List[Dict[str, str]]]) -> Dict[str, Any]:
        """What the stages add to ``summary.json`` (default nothing)."""
        return {}


class SingleStage(Stage):
    """A run of one stage: unit ``i`` keeps node ``i`` out of the low precision; ``maker`` builds the candidates.

    Args:
        maker: the run's candidate maker.
        model, layers, forced: as ``Stage``'s.
        switchboard: the candidates' switched model (``CandidateMaker.switchboard``), or None.
    """

    def __init__(
        self,
        maker: CandidateMaker,
        model: onnx.ModelProto,
        layers: Iterable[int],
        forced: Iterable[int],
        switchboard: Optional[LazySwitchboard],
    ):
        super().__init__(model, layers, forced)
        self.maker, self.switchboard = maker, switchboard

    def convert(self, units: Units) -> onnx.ModelProto:
        return self.maker.candidate(self.names(units | self.forced))

    def size(self, units: Units) -> str:
        return self.maker.describe(len(units), len(self.layers))

    def step(self, units: Units) -> str:
        return f"the {self.maker.low} conversion keeping {len(units)} of {len(self.layers)} nodes in float32"

    def info(self, units: Units) -> Dict[str, Any]:
        return {"kept": len(units), "total": len(self.layers)}

    def everything_size(self) -> str:
        """How the all-fp32 gate's candidate reads in its label."""
        return self.size(self.everything())

    def first_search(self, marker: Callable[[int], BoundaryMarker], direction: str) -> Optional[Search]:
        """The search of a stage before the low precision's own (fp16 before int8), or None (default)."""
        return None

    def switched(self, units: Units) -> Optional[Switched]:
        return None if self.switchboard is None else Switched(self.switchboard, units | self.forced)
