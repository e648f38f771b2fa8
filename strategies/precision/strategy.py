"""``mode=precision``: find the fewest nodes that must stay in fp32 for the check to pass.

Each candidate is the ONNX model converted to the low precision (fp16 or bf16) except a kept
set of nodes (``runner.lowp.convert``), or with ``low_precision=int8`` quantized to QDQ except
the kept nodes (``runner.lowp.quantize``: calibrated once per run, each candidate quantized with
those ranges); the same candidate runs on CPU (fp16 through emulation, QDQ as written) or is
built strongly typed by TensorRT, and the final one is what the user deploys.

Markers:
    bisect / linear: Polygraphy's algorithm. Keep a prefix (``direction=forward``, from the
        network inputs) or a suffix (``reverse``, from the outputs) of the nodes in topological
        order, and search its length for the shortest that passes. ``direction=ranked`` takes
        prefixes of the nodes ranked by the error each introduces in the low precision
        (``runner.layerwise.ranking``) instead: about log2 n checks, a far smaller kept set.
    minimal: a group search (``strategies.precision.group_search``) over that ranking: the shortest
        passing ranked prefix, then its unneeded nodes dropped in groups of a learnt size, ending
        with a 1-minimal kept set: dropping any one kept node fails the check.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, cast

import onnx

from runner.candidates import Candidate
from runner.checkers.base import Checker
from runner.context import RunContext
from runner.errors import ConfigError
from runner.graph.decisions import data_dependent_outputs
from runner.graph.load import fingerprint, save_model
from runner.graph.validate import Validator
from runner.graph.weights import initializer_bytes
from runner.write_guard import check_write
from strategies.boundary import BoundaryMarker, marker_name
from strategies.gate import Gate
from strategies.mode_keys import PrecisionKeys
from strategies.onnx_search import Search, Units
from strategies.precision.deferred_search import DeferredSearch
from strategies.precision.facts import exchange_facts, tied_facts
from strategies.precision.gates import PrecisionGates
from strategies.precision.search import ranked_search
from strategies.precision.setup import PrecisionSetup, precision_setup
from strategies.precision.tradeoff import Tradeoff
from strategies.prefix_search import PrefixSearch

log = logging.getLogger(__name__)

KEYS = PrecisionKeys


class PrecisionStrategy(PrecisionGates):
    """Searches for the kept (high-precision) node set.

    Args:
        setup: what the run searches (``strategies.precision.setup.PrecisionSetup``): the prepared model, the
            nodes it may keep, the candidate maker and the stages, the marker, the ranking.

    Raises:
        ConfigError: when the model has no float nodes.
    """

    #: its precision is the point: checkers never convert a precision candidate
    as_typed = True

    def __init__(self, setup: PrecisionSetup):
        if not setup.layers:
            raise ConfigError("the model has no float nodes to keep or convert; precision marking does not apply")
        self.model, self.layers, self.low, self.maker = setup.model, list(setup.layers), setup.low, setup.maker
        #: what the unit sets mean: one stage, or int8 with the rest in fp16 (``strategies.precision.stages``)
        self.stage = setup.stage
        self.forced: Units = frozenset(setup.forced)
        self.reorder, self.blocks, self.scoped = setup.reorder, setup.blocks, setup.scoped
        self.direction = setup.direction if setup.ranking is None else "ranked"
        self.weak_typing = setup.weak_typing
        self.artifact_suffix = ".engine" if setup.weak_typing else ".onnx"
        #: the low precision's own search (with the rest in fp16, the second stage's)
        self._low_search = self._search(setup)
        first = self.stage.first_search(setup.marker, self.direction)
        super().__init__(
            first or self._low_search, self.layers, True, setup.output, setup.save_opts, fingerprint(self.model)
        )
        # a large model's candidates that point into the weight file hold no weights: they may be built ahead
        self.ahead.weight_bytes = 0 if self.maker.weightless else initializer_bytes(self.model)
        self.answer_opts = dict(setup.answer_opts)
        self.budget = setup.budget
        self.reorder.budget = setup.budget
        self.run_dir = setup.run_dir
        #: every search candidate's point, and the early verdict when most must stay (``strategies.precision.tradeoff``)
        self.tradeoff: Optional[Tradeoff] = Tradeoff(len(self.layers), self.low.name)
        self.verify_answer = not setup.weak_typing  # an engine built with layer precisions is no model to load back
        self.answer_cpu_load = True  # a model the tool converted
        self.answer_must_load_on_cpu = self.low.name != "bfloat16"  # ONNX Runtime's CPU provider has no bf16 kernels
        self.validator = Validator(self.model)
        self.marker_name = marker_name(setup.marker)
        self.original = setup.original
        self.original_name = setup.model_name
        self.universe = self.stage.everything()
        self.gates.append(Gate(self._all_kept, True, self._all_kept_failed))
        # the all-low-precision candidate is checked only when no search candidate has failed yet
        self._some_failed = False
        self._none_queued = False
        #: the all-kept candidate as the pipeline builds it is checked once a large candidate fails
        #: (``PIPELINE_CHECK_FROM``); only where the all-fp32 gate checked the model as given
        self._pipeline_checked = self.original is None or setup.weak_typing or setup.scoped
        if self.original is not None and not self._pipeline_checked and data_dependent_outputs(self.original):
            # a model whose outputs are decisions (NMS on near-tied scores) may flip one between two builds of the
            # same fp32 graph: as the candidates are built, it is checked right after the model as given
            self._pipeline_checked = True
            self.gates.append(self._pipeline_gate())
        self._search_passed = False
        if first is not None:  # the first stage (fp16) first; the int8 gate below comes with the int8 stage
            self._none_queued = True
            self.gates.append(
                Gate(
                    lambda: self.candidate(frozenset(), "every float node in float16, none in int8"),
                    False,
                    self._all_fp16_passed,
                )
            )
        elif self.low.quantized:
            # post-training int8 often passes as it is: the fully quantized model is checked first (a pass
            # settles the run in three checks with the answer's; a failure is what the search assumes)
            self._none_queued = True
            self.gates.append(self._int8_gate())

    @staticmethod
    def _search(setup: PrecisionSetup) -> Search:
        """The low precision's own search: ranked (deferred while the ranking is a function), else prefixes."""
        marker, reorder, blocks = setup.marker, setup.reorder, setup.blocks
        untie, exchange_checks, ranking = setup.untie, setup.exchange_checks, setup.ranking
        if callable(ranking):
            rank = ranking
            return cast(
                Search,
                DeferredSearch(
                    lambda: ranked_search(rank(), marker, reorder, blocks, untie, exchange_checks),
                    ranked_search(list(setup.layers), marker),
                ),
            )
        if ranking is not None:
            return ranked_search(ranking, marker, reorder, blocks, untie, exchange_checks)
        return PrefixSearch(list(setup.layers) if setup.direction == "forward" else setup.layers[::-1], marker)

    @classmethod
    def create(
        cls,
        ctx: RunContext,
        keys: PrecisionKeys,
        *,
        checker: Optional[Checker] = None,
        marker: Optional[Callable[[int], BoundaryMarker]] = None,
    ) -> PrecisionStrategy:
        """The strategy for a run: ``ctx.model`` prepared, nodes ranked for a set search, as
        ``strategies.precision.setup.precision_setup`` sets it up from the same arguments.

        Raises:
            ModelError, ConfigError, MissingExtraError: as ``precision_setup`` says.
        """
        return cls(precision_setup(ctx, keys, checker, marker))

    # -- candidates -----------------------------------------------------------------------

    def _all_kept(self) -> Candidate:
        """The all-fp32 gate's candidate: the model as given, run as its golden values were made (with the
        rest in fp16, built: every float node kept in fp32, none in int8)."""
        made = self.candidate(self.stage.everything(), "all nodes kept")
        if self.original is None or self.weak_typing or self.scoped:  # with a scope, nodes out of it are converted
            return made
        original = self.original

        def write(path: Path) -> None:
            save_model(original, path, **self.save_opts)

        return dataclasses.replace(
            made,
            key=f"{made.key}:as-given",  # its verdict is the model's as given, not the built candidate's
            label=f"all nodes kept (the model as given): {self.stage.everything_size()}",
            write=write,
            payload=lambda: original,
            as_reference=True,
            switched=None,
        )

    def candidate(self, units: Units, label: str) -> Candidate:
        """The candidate of ``units``, also as feeds of the stage's switchboard where it has one."""
        made = super().candidate(units, label)
        switched = self.stage.switched(made.units) if made.units is not None else None
        return made if switched is None else dataclasses.replace(made, switched=switched)

    def closure(self, units: Units) -> Units:
        """The unit set a search set is checked as (``Stage.closure``: with the rest in fp16, a set of the int8
        stage with the fp16 stage's answer)."""
        return self.stage.closure(units)

    def answer_of(self, result: Units) -> Units:
        """The search's result with what its candidates hold besides (``closure``)."""
        return self.closure(result)

    def next_stage(self) -> bool:
        """Once a first stage (fp16, with the rest in fp16) has its answer: start the low precision's search, the
        fully quantized candidate checked first (``strategies.precision.float_rest``)."""
        if self.final is None or not self.stage.next_stage(self.final):
            return False
        self.begin_stage(self._low_search)
        self.universe = frozenset(self.layers)  # every node out of int8
        self._search_passed = False
        self.gates.append(self._int8_gate())
        return True

    def names(self, units: Iterable[int]) -> List[str]:
        """The node names of ``units``, sorted."""
        return self.stage.names(units)

    def model_for(self, units: Units) -> onnx.ModelProto:
        """The stage's candidate of ``units`` (``Stage.convert``)."""
        return self.stage.convert(units)

    def step(self, units: Units) -> str:
        """The conversion that made the candidate."""
        return self.stage.step(units)

    def size(self, units: Units) -> str:
        """How many nodes stay in float32 (with the rest in fp16: how many are in fp32, and out of int8)."""
        return self.stage.size(units)

    def variant(self) -> str:
        """The low precision (and the TensorRT path when weakly typed; the stage, with the rest in fp16)."""
        return self.low.name + (":weak" if self.weak_typing else "") + self.stage.variant()

    def info(self, units: Units) -> Dict[str, Any]:
        """Kept and total node counts (with the rest in fp16, also ``fp32`` and the stage)."""
        return self.stage.info(units)

    def describe(self, units: Iterable[int]) -> List[Dict[str, str]]:
        """Name and op type of each node a unit names, in topological order."""
        nodes = sorted(self.stage.nodes(units))
        return [{"name": self.model.graph.node[i].name, "op": self.model.graph.node[i].op_type} for i in nodes]

    def write_candidate(self, units: Units, model: Callable[[], onnx.ModelProto], path: Path) -> None:
        """The mixed-precision model, or with ``weak_typing`` an engine built with layer precisions."""
        if not self.weak_typing:
            return super().write_candidate(units, model, path)
        from runner.trt.weak_precision import build_weakly_typed

        check_write(path, "an engine")
        path.write_bytes(build_weakly_typed(self.model.SerializeToString(), self.names(units | self.forced), self.low))

    def payload(self, model: Callable[[], onnx.ModelProto]) -> Optional[Callable[[], onnx.ModelProto]]:
        """The model for in-process checkers; none for engines (``weak_typing``)."""
        return None if self.weak_typing else model

    # -- gates ----------------------------------------------------------------------------

    # -- results --------------------------------------------------------------------------

    def _built_search(self) -> Any:
        """The low precision's search itself: a deferred search's, once built (``DeferredSearch``), else the
        search."""
        return getattr(self._low_search, "_search", self._low_search)

    def result(self) -> Dict[str, Any]:
        """``kept_nodes`` (names and op types), ``kept``, ``total``, ``output`` for summary.json; int8's
        ``calibration``, and ``ranked_again`` (nodes, seconds, switched) when the nodes were ranked again;
        the search's own facts (``strategies.precision.facts``)."""
        assert self.final is not None
        kept = self.stage.kept(self.final)
        return {
            "kept_nodes": self.describe(kept),
            **({"forced_float": self.describe(self.forced)} if self.forced else {}),
            "kept": len(kept),
            "total": len(self.layers),
            "output": str(self.output),
            "marker": self.marker_name,
            "direction": self.direction,
            "low_precision": self.low.name,
            **({"calibration": self.maker.calibration.summary()} if self.maker.calibration is not None else {}),
            **({"ranked_again": self.reorder.facts} if self.reorder.facts else {}),
            **tied_facts(self.blocks, self._built_search()),
            **exchange_facts(self._built_search()),
            **self.stage.facts(self.final, self.describe),
            **self.answer_outputs(),
            **self.answer_verified(),
            **(self.budget.facts() if self.budget is not None else {}),
            **(self.tradeoff.facts() if self.tradeoff is not None else {}),
        }

    def finish(self) -> None:
        """The answer (``OnnxSearchStrategy.finish``), and ``tradeoff.png`` in the run directory."""
        super().finish()
        if self.tradeoff is not None and self.run_dir is not None:
            try:
                answer = len(self.stage.kept(self.final)) if self.final is not None else None
                self.tradeoff.plot(self.run_dir / "tradeoff.png", answer, self.original_name)
            except OSError as e:  # a figure must not cost the answer
                log.warning("Could not write tradeoff.png: %s", e)
