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
from runner.config import Untie
from runner.context import RunContext
from runner.errors import ConfigError
from runner.graph.blocks import Blocks
from runner.graph.load import fingerprint, save_model
from runner.graph.validate import Validator
from runner.graph.weights import initializer_bytes
from runner.lowp.calibration import Calibration
from runner.lowp.convert import Converter
from runner.lowp.precisions import FLOAT16, LowPrecision
from runner.lowp.quantize import Quantizer
from runner.lowp.switchboard import LazySwitchboard, Switched
from strategies.boundary import BoundaryMarker, marker_name
from strategies.budget import Budget
from strategies.gate import Gate
from strategies.mode_keys import PrecisionKeys
from strategies.onnx_search import Search, Units
from strategies.precision.deferred_search import DeferredSearch
from strategies.precision.facts import exchange_facts, rest_facts, tied_facts
from strategies.precision.float_rest import FloatRest
from strategies.precision.gates import PrecisionGates
from strategies.precision.search import float16_stage, ranked_search
from strategies.precision.setup import precision_arguments
from strategies.precision.space import OutputErrorOrder, switchboard_of
from strategies.precision.tradeoff import Tradeoff
from strategies.prefix_search import PrefixSearch

log = logging.getLogger(__name__)

KEYS = PrecisionKeys


class PrecisionStrategy(PrecisionGates):
    """Searches for the kept (high-precision) node set.

    Args:
        model: the fp32 model, nodes named, Constant nodes as initializers.
        layers: indices of the nodes that can be kept, in topological order.
        marker: ``marker(count)`` returns a boundary marker (bisect, linear or minimal).
        direction: "forward" or "reverse" (prefix markers only).
        low: "float16", "bfloat16" or "int8".
        output: where the final mixed-precision model is written.
        ranking: the nodes ranked by introduced error, for the minimal marker (a ranked search) or
            ``direction="ranked"`` (a prefix search over it), or a function computing it when the
            search first needs it; None: topological prefixes.
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.
        weak_typing: candidates are TensorRT <= 10 engines built with layer precisions.
        quantizer: for int8, builds the QDQ candidates from the run's calibration.
        forced: indices of nodes that stay in float32 in every candidate (``exclude_nodes``,
            ``exclude_op_types``), outside the search.
        scoped: some float nodes are outside the search (``include_*``/``exclude_*``).
        original: the model as the user gave it: the all-fp32 gate checks it, as it is (its golden
            values' own model, ``Candidate.as_reference``), so that gate cannot fail for the tool's
            own reasons (a re-fused fp32 run flipped one box of a detector's NMS); None: the
            conversion keeping every node.
        converter: the fp16/bf16 converter the ranking made (``precision_space.SearchSpace.converter``), so
            that each weight's low-precision form is made once per run; None: one of its own.
        reorder: ranks the nodes again for a ranked set search that finds them many
            (``precision_space.OutputErrorOrder``: the output-error ranking); None: never.
        switchboard: the candidates' switchboard the search space made (which the second ranking
            runs on too); None: one of the converter's or quantizer's own (``switchboard_of``).
        blocks: the model's repeated blocks (``runner.graph.blocks``): a set search decides each tied
            block position once first (``strategies.precision.tied_search``); None: node by node.
        untie: how far a tied answer is searched block by block (``Untie``).
        exchange_checks: checks a minimal search may spend trading two kept nodes for one after its
            1-minimal answer (``strategies.precision.exchange``; 0: none; not over tied
            blocks).
        rest: int8 with the rest in fp16 (``quantization.float_precision=float16``,
            ``strategies.precision.float_rest``):
            an fp16 stage first finds the nodes that must stay fp32, then the int8 search runs with
            them in fp32 and the rest in fp16; None: the rest stays fp32.
        budget: where the search stops short with the best answer checked so far (``strategies.budget``);
            None: it runs to its minimal answer.
        run_dir: the run's directory, where ``tradeoff.png`` goes; None: nowhere.

    Raises:
        ConfigError: when the model has no float nodes.
    """

    #: its precision is the point: checkers never convert a precision candidate
    as_typed = True

    def __init__(
        self,
        model: onnx.ModelProto,
        layers: List[int],
        marker: Callable[[int], BoundaryMarker],
        direction: str = "forward",
        low: LowPrecision = FLOAT16,
        output: Path = Path("mixed_precision.onnx"),
        ranking: Optional[List[int] | Callable[[], List[int]]] = None,
        save_opts: Optional[Dict[str, Any]] = None,
        weak_typing: bool = False,
        quantizer: Optional[Quantizer] = None,
        forced: Iterable[int] = (),
        scoped: bool = False,
        original: Optional[onnx.ModelProto] = None,
        converter: Optional[Converter] = None,
        reorder: Optional[OutputErrorOrder] = None,
        switchboard: Optional[LazySwitchboard] = None,
        blocks: Optional[Blocks] = None,
        untie: Untie = Untie.auto,
        exchange_checks: int = 0,
        rest: Optional[FloatRest] = None,
        budget: Optional[Budget] = None,
        run_dir: Optional[Path] = None,
    ):
        self.forced: Units = frozenset(forced)
        self.rest = rest
        self.reorder = reorder
        self.blocks = blocks
        self.scoped = scoped
        if not layers:
            raise ConfigError("the model has no float nodes to keep or convert; precision marking does not apply")
        self.model = model
        self.layers = list(layers)
        self.direction = direction if ranking is None else "ranked"
        self.low = low
        self.weak_typing = weak_typing
        self.artifact_suffix = ".engine" if weak_typing else ".onnx"
        search: Search

        if callable(ranking):
            rank = ranking
            search = cast(
                Search,
                DeferredSearch(
                    lambda: ranked_search(rank(), marker, reorder, blocks, untie, exchange_checks),
                    ranked_search(self.layers, marker),
                ),
            )
        elif ranking is not None:
            search = ranked_search(ranking, marker, reorder, blocks, untie, exchange_checks)
        else:
            search = PrefixSearch(self.layers if direction == "forward" else self.layers[::-1], marker)
        #: the int8 search (the only one without ``rest``; with it, the second stage's)
        self._int8_search = search
        if rest is not None:
            search = float16_stage(rest, marker, self.direction)
        super().__init__(search, self.layers, True, output, save_opts, fingerprint(model))
        self.ahead.weight_bytes = initializer_bytes(model)
        self.budget = budget
        if reorder is not None:
            reorder.budget = budget
        self.run_dir = run_dir
        #: every search candidate's point, and the early verdict when most must stay (``strategies.precision.tradeoff``)
        self.tradeoff: Optional[Tradeoff] = Tradeoff(len(self.layers), low.name)
        self.converter: Optional[Any] = quantizer or (converter or Converter(model, low) if not weak_typing else None)
        #: the candidates as feeds of one switched model (built when a checker first runs one)
        self.switchboard = switchboard or switchboard_of(self.converter, f"switchboard:{self.fingerprint}:{low}")
        self.calibration: Optional[Calibration] = quantizer.calibration if quantizer is not None else None
        self.verify_answer = not weak_typing  # an engine built with layer precisions is no model to load back
        self.answer_cpu_load = True  # a model the tool converted
        self.answer_must_load_on_cpu = str(low) != "bfloat16"  # ONNX Runtime's CPU provider has no bfloat16 kernels
        self.validator = Validator(model)
        self.marker_name = marker_name(marker)
        everything: Units = frozenset(self.layers)
        self.original = original
        self.gates.append(Gate(lambda: self._all_kept(everything), True, self._all_kept_failed))
        # the all-low-precision candidate is checked only when no search candidate has failed yet
        self._some_failed = False
        self._none_queued = False
        #: the all-kept candidate as the pipeline builds it is checked once a large candidate fails
        #: (``PIPELINE_CHECK_FROM``); only where the all-fp32 gate checked the model as given
        self._pipeline_checked = self.original is None or weak_typing or scoped
        self._search_passed = False
        if rest is not None:  # the fp16 stage first; the int8 gate below comes with the int8 stage
            self.universe = frozenset(rest.encode(rest.layers))  # every float node in fp32
            self._none_queued = True
            self.gates.append(
                Gate(
                    lambda: self.candidate(frozenset(), "every float node in float16, none in int8"),
                    False,
                    self._all_fp16_passed,
                )
            )
        elif quantizer is not None:
            # post-training int8 often passes as it is: the fully quantized model is checked first (a pass
            # settles the run in three checks with the answer's; a failure is what the search assumes)
            self._none_queued = True
            self.gates.append(self._int8_gate())

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
        ``strategies.precision.setup.precision_arguments`` sets it up from the same arguments.

        Raises:
            ModelError, ConfigError, MissingExtraError: as ``precision_arguments`` says.
        """
        return cls(**precision_arguments(ctx, keys, checker, marker))

    # -- candidates -----------------------------------------------------------------------

    def _all_kept(self, everything: Units) -> Candidate:
        """The all-fp32 gate's candidate: the model as given, run as its golden values were made (with the
        rest in fp16, built: every float node kept in fp32, none in int8)."""
        if self.rest is not None:
            everything = frozenset(self.rest.encode(self.rest.layers))
        made = self.candidate(everything, "all nodes kept")
        if self.original is None or self.weak_typing or self.scoped:  # with a scope, nodes out of it are converted
            return made
        original = self.original
        size = "every node in float32" if self.rest is not None else self.size(everything)

        def write(path: Path) -> None:
            save_model(original, path, **self.save_opts)

        return dataclasses.replace(
            made,
            key=f"{made.key}:as-given",  # its verdict is the model's as given, not the built candidate's
            label=f"all nodes kept (the model as given): {size}",
            write=write,
            payload=lambda: original,
            as_reference=True,
            switched=None,
        )

    def candidate(self, units: Units, label: str) -> Candidate:
        """The candidate of ``units``, also as feeds of the search's switchboard where it has one (not
        in the fp16 stage, whose candidates no switchboard holds)."""
        made = super().candidate(units, label)
        if self.switchboard is None or made.units is None or self.rest is not None:
            return made
        return dataclasses.replace(made, switched=Switched(self.switchboard, made.units | self.forced))

    def closure(self, units: Units) -> Units:
        """A set of the int8 stage with the fp16 stage's answer (``FloatRest.closure``); else as it is."""
        return self.rest.closure(units) if self.rest is not None else units

    def answer_of(self, result: Units) -> Units:
        """The search's result with what its candidates hold besides (``closure``)."""
        return self.closure(result)

    def next_stage(self) -> bool:
        """With the rest in fp16, once the fp16 stage has its answer: start the int8 search, the fully
        quantized candidate checked first (``strategies.precision.float_rest``)."""
        if not self._fp16_stage or self.final is None:
            return False
        assert self.rest is not None
        self.rest.start_int8(self.final)
        self.begin_stage(self._int8_search)
        self.universe = frozenset(self.layers)  # every node out of int8
        self._search_passed = False
        self.gates.append(self._int8_gate())
        return True

    def names(self, units: Iterable[int]) -> List[str]:
        """The node names of ``units``, sorted."""
        return sorted(self.model.graph.node[i].name for i in units)

    def model_for(self, units: Units) -> onnx.ModelProto:
        """The model in the low precision except ``units``, which stay in float32 (with the rest in fp16, the
        stage's candidate: ``FloatRest.convert``)."""
        if self.rest is not None:
            return self.rest.convert(units)
        if self.converter is None:
            self.converter = Converter(self.model, self.low)
        return self.converter.convert(self.names(units | self.forced))

    def step(self, units: Units) -> str:
        """The conversion that made the candidate."""
        if self.rest is not None:
            return f"the {self.rest.stage} stage's conversion keeping {self.size(units)}"
        return f"the {self.low} conversion keeping {len(units)} of {len(self.layers)} nodes in float32"

    def size(self, units: Units) -> str:
        """How many nodes stay in float32 (with the rest in fp16: how many are in fp32, and out of int8)."""
        if self.rest is not None:
            out, fp32 = self.rest.split(units)
            where = f"{len(fp32)} of {len(self.rest.layers)} float nodes in float32, the rest float16"
            if self._fp16_stage:
                return f"{where}, none in int8"
            return f"{len(out)} of {len(self.layers)} nodes out of int8; {where}"
        return f"{len(units)} of {len(self.layers)} nodes in float32"

    def variant(self) -> str:
        """The low precision (and the TensorRT path when weakly typed; the stage, with the rest in fp16)."""
        stage = f":{self.rest.stage}-stage" if self.rest is not None else ""
        return self.low.name + (":weak" if self.weak_typing else "") + stage

    def info(self, units: Units) -> Dict[str, Any]:
        """Kept and total node counts (in the fp16 stage: kept out of int8, and ``fp32``)."""
        if self.rest is not None:
            out, fp32 = self.rest.split(units)
            kept = len(self.layers) if self._fp16_stage else len(out)
            return {"kept": kept, "total": len(self.layers), "fp32": len(fp32), "stage": self.rest.stage}
        return {"kept": len(units), "total": len(self.layers)}

    def describe(self, units: Iterable[int]) -> List[Dict[str, str]]:
        """Name and op type of each node, in topological order (a unit of the fp16 stage names its node)."""
        nodes = sorted({self.rest.node_of(u) for u in units} if self.rest is not None else set(units))
        return [{"name": self.model.graph.node[i].name, "op": self.model.graph.node[i].op_type} for i in nodes]

    def write_candidate(self, units: Units, model: Callable[[], onnx.ModelProto], path: Path) -> None:
        """The mixed-precision model, or with ``weak_typing`` an engine built with layer precisions."""
        if not self.weak_typing:
            return super().write_candidate(units, model, path)
        from runner.trt.weak_precision import build_weakly_typed

        path.write_bytes(build_weakly_typed(self.model.SerializeToString(), self.names(units | self.forced), self.low))

    def payload(self, model: Callable[[], onnx.ModelProto]) -> Optional[Callable[[], onnx.ModelProto]]:
        """The model for in-process checkers; none for engines (``weak_typing``)."""
        return None if self.weak_typing else model

    # -- gates ----------------------------------------------------------------------------

    # -- results --------------------------------------------------------------------------

    def _built_search(self) -> Any:
        """The int8 (or only) stage's search itself: a deferred search's, once built (``DeferredSearch``),
        else the search."""
        return getattr(self._int8_search, "_search", self._int8_search)

    def result(self) -> Dict[str, Any]:
        """``kept_nodes`` (names and op types), ``kept``, ``total``, ``output`` for summary.json; int8's
        ``calibration``, and ``ranked_again`` (nodes, seconds, switched) when the nodes were ranked again;
        the search's own facts (``strategies.precision.facts``)."""
        assert self.final is not None
        kept = self.rest.split(self.final)[0] if self.rest is not None else self.final
        return {
            "kept_nodes": self.describe(kept),
            **({"forced_float": self.describe(self.forced)} if self.forced else {}),
            "kept": len(kept),
            "total": len(self.layers),
            "output": str(self.output),
            "marker": self.marker_name,
            "direction": self.direction,
            "low_precision": self.low.name,
            **({"calibration": self.calibration.summary()} if self.calibration is not None else {}),
            **({"ranked_again": self.reorder.facts} if self.reorder is not None and self.reorder.facts else {}),
            **tied_facts(self.blocks, self._built_search()),
            **exchange_facts(self._built_search()),
            **rest_facts(self.rest, self.final, self.forced, self.describe),
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
                self.tradeoff.plot(self.run_dir / "tradeoff.png")
            except OSError as e:  # a figure must not cost the answer
                log.warning("Could not write tradeoff.png: %s", e)
