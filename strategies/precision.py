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
    minimal: a group search (``strategies.group_search``) over that ranking: the shortest
        passing ranked prefix, then its unneeded nodes dropped in groups of a learnt size, ending
        with a 1-minimal kept set: dropping any one kept node fails the check.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, cast

import onnx

from runner.candidates import Candidate, Switched, Verdict
from runner.checkers.base import Checker
from runner.context import RunContext
from runner.errors import CheckNeverPassedError, ConfigError
from runner.graph.blocks import Blocks, find_blocks
from runner.graph.load import fingerprint, save_model
from runner.graph.scope import Scope
from runner.graph.validate import Validator
from runner.graph.weights import initializer_bytes
from runner.lowp.calibration import Calibration
from runner.lowp.convert import Converter
from runner.lowp.precisions import FLOAT16, LowPrecision, any_low_precision, is_quantized
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import Quantizer
from runner.lowp.switchboard import LazySwitchboard
from strategies.boundary import BoundaryMarker, marker_name, searches_sets
from strategies.deferred_search import DeferredSearch
from strategies.float_rest import FloatRest
from strategies.mode_keys import PrecisionKeys
from strategies.onnx_search import Gate, OnnxSearchStrategy, Search, Units
from strategies.precision_facts import exchange_facts, rest_facts, tied_facts
from strategies.precision_search import exchange_budget, float16_stage, ranked_search
from strategies.precision_space import OutputErrorOrder, float_rest, search_space, switchboard_of
from strategies.prefix_search import PrefixSearch
from strategies.tied_search import Untie

log = logging.getLogger(__name__)


KEYS = PrecisionKeys

#: the share of the searched nodes a failing candidate keeps (and at least 32) from which the all-kept
#: candidate as the pipeline builds it is checked once: a run whose every candidate fails for what the
#: pipeline changes stops there, in about 10 checks, instead of searching the whole model
PIPELINE_CHECK_FROM = 1 / 8


class PrecisionStrategy(OnnxSearchStrategy):
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
            block position once first (``strategies.tied_search``); None: node by node.
        untie: how far a tied answer is searched block by block (``Untie``).
        exchange_checks: checks a minimal search may spend trading two kept nodes for one after its
            1-minimal answer (``strategies.exchange``; 0: none; not over tied blocks).
        rest: int8 with the rest in fp16 (``quantization.float_precision=float16``, ``strategies.float_rest``):
            an fp16 stage first finds the nodes that must stay fp32, then the int8 search runs with
            them in fp32 and the rest in fp16; None: the rest stays fp32.

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
        self.weight_bytes = initializer_bytes(model)
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
        """Prepare ``ctx.model`` (nodes named, Constant nodes as initializers); rank nodes for a set search.

        Args:
            ctx: the run context (model; feeds and fp32 values for the ranking).
            keys: the mode's keys: int8's ``calibration`` is computed once here, on the samples of
                ``inputs=``/``data_loader=``; only nodes in the scope (``runner.graph.scope``) are
                searched, excluded ones stay float32.
            checker: the run's checker; when it judges on a device (CUDA EP, TensorRT) the ranking
                runs there too (``ranking_backend``).
            marker: the marker factory (``marker=``).

        Raises:
            ModelError: bad model. ConfigError: unsupported precisions or options; int8 without
                input samples to calibrate on, or bad ones.
            MissingExtraError: ``weak_typing=true`` without TensorRT.
        """
        if marker is None:
            raise ConfigError("mode=precision needs a marker (marker=bisect, linear or minimal)")
        precision, direction, weak_typing = keys.precision.value, keys.direction.value, keys.weak_typing
        if precision != "float32":
            raise ConfigError(
                f"precision={precision}: kept nodes stay in float32 (low_precision=int8's too); "
                "use precision=float32 with low_precision=float16, bfloat16 or int8"
            )
        low_precision = any_low_precision(keys.low_precision)
        assert low_precision is not None  # the schema's default is float16
        if is_quantized(low_precision) and weak_typing:
            raise ConfigError(
                "weak_typing=true builds layer precisions into an engine; int8 candidates are QDQ models that "
                "TensorRT builds strongly typed: drop weak_typing"
            )
        if weak_typing:
            from runner.trt import load_tensorrt

            load_tensorrt("weak_typing=true")
        quant = QuantOptions.from_keys(keys) if is_quantized(low_precision) else None
        ranked = searches_sets(marker) or direction == "ranked"
        budget = keys.ranking_memory_mb
        if budget is not None and not float(budget) > 0:
            raise ConfigError(f"ranking_memory_mb={budget}; give a positive number of MiB, or null for no limit")
        ranking_budget = None if budget is None else int(float(budget) * 2**20)
        space = search_space(ctx, low_precision, Scope.from_keys(keys), quant, checker, ranked, ranking_budget)
        rest = float_rest(ctx, space, checker, ranking_budget) if quant is not None and quant.float16_rest else None
        blocks = find_blocks(space.model, space.layers) if keys.tie_blocks and searches_sets(marker) else None
        if blocks is not None:
            families = ", ".join(f"{name} x{len(found)}" for name, found in blocks.families.items())
            log.info(
                "The model repeats blocks (%s, found by %s): %d of %d searched nodes in %d tied positions, "
                "each decided once for every block first (tie_blocks=false: node by node)",
                families,
                blocks.how,
                len(blocks.tied_nodes & frozenset(space.layers)),
                len(space.layers),
                len(blocks.ties),
            )
        return cls(
            space.model,
            space.layers,
            marker,
            direction,
            low_precision,
            Path(keys.output or "mixed_precision.onnx"),
            space.ranking,
            {"external_data": keys.external_data, "threshold": keys.external_data_threshold},
            weak_typing,
            space.quantizer,
            space.forced,
            space.scoped,
            ctx.model,
            space.converter,
            space.reorder,
            space.switchboard,
            blocks,
            keys.untie,
            exchange_budget(keys.exchange_checks, is_quantized(low_precision)),
            rest,
        )

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

    @property
    def _fp16_stage(self) -> bool:
        """Whether the fp16 stage of an int8 search with the rest in fp16 runs (``strategies.float_rest``)."""
        return self.rest is not None and self.rest.stage == "float16"

    def closure(self, units: Units) -> Units:
        """A set of the int8 stage with the fp16 stage's answer (``FloatRest.closure``); else as it is."""
        return self.rest.closure(units) if self.rest is not None else units

    def answer_of(self, result: Units) -> Units:
        """The search's result with what its candidates hold besides (``closure``)."""
        return self.closure(result)

    def next_stage(self) -> bool:
        """With the rest in fp16, once the fp16 stage has its answer: start the int8 search, the fully
        quantized candidate checked first (``strategies.float_rest``)."""
        if not self._fp16_stage or self.final is None:
            return False
        assert self.rest is not None
        self.rest.start_int8(self.final)
        self.begin_stage(self._int8_search)
        self.universe = frozenset(self.layers)  # every node out of int8
        self._search_passed = False
        self.gates.append(self._int8_gate())
        return True

    def _all_fp16_passed(self, verdict: Verdict) -> None:
        log.info("The check passes with every float node in float16: no node needs float32")
        self.final = frozenset()

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

    def _all_kept_failed(self, verdict: Verdict) -> None:
        where = "every node in scope" if self.scoped else "every node"
        advice = "widen include_nodes/include_op_types, or check " if self.scoped else "check "
        raise CheckNeverPassedError(
            f"the check fails even with {where} in float32, so no kept set can pass; "
            f"{advice}the checker, its tolerances and the golden outputs",
            tail=verdict.output_tail,
        )

    def on_search_verdict(self, units: Units, verdict: Verdict) -> None:
        """A failing search candidate shows that no smaller kept set passes, the empty one included
        (monotone); a pass before any failure queues the all-low-precision check, which then runs
        before the search goes on (the markers assume it fails). The first failing candidate that keeps
        ``PIPELINE_CHECK_FROM`` of the nodes or more queues the all-kept candidate as the pipeline
        builds it (``_pipeline_gate``)."""
        self._search_passed = self._search_passed or verdict.passed
        if self._fp16_stage:
            return
        if not verdict.passed:
            self._some_failed = True
            if not self._pipeline_checked and len(units) >= max(32, len(self.layers) * PIPELINE_CHECK_FROM):
                self._pipeline_checked = True
                self.gates.append(self._pipeline_gate())
        elif not self._some_failed and not self._none_queued:
            self._none_queued = True
            self.gates.append(self._none_gate())

    def after_search(self) -> Optional[Gate]:
        """The all-low-precision check, when the search ended without testing anything; the all-kept
        candidate as the pipeline builds it, when no search candidate passed (the answer rests on the
        all-fp32 gate's model as given alone). None in the fp16 stage of an int8 search with the rest in fp16."""
        if self._fp16_stage:
            return None
        if not self._pipeline_checked and not self._search_passed and self._some_failed:
            self._pipeline_checked = True
            return self._pipeline_gate()
        if self._some_failed or self._none_queued or not self.final:
            return None
        return self._none_gate()

    def _pipeline_gate(self) -> Gate:
        """Every node kept, as the pipeline builds candidates (not the model as given): a check that fails
        it can never pass a candidate, whatever the search keeps, because what changes outside the searched
        nodes already flips it."""
        everything: Units = frozenset(self.layers)
        return Gate(
            lambda: self.candidate(everything, "every node kept, as candidates are built"), True, self._pipeline_failed
        )

    def _pipeline_failed(self, verdict: Verdict) -> None:
        raise CheckNeverPassedError(
            f"every node kept in float32 fails as candidates are built ({verdict.reason or 'no reason given'}), "
            "though your model as given passes: what the candidates change outside the searched nodes (the "
            f"{self.low} conversion's Casts at the graph's inputs and outputs, nodes it cannot convert, how the "
            "backend runs a converted graph) already flips the check, so no kept set can pass; compare the tensors "
            "before a decision (checker.outputs=[...]), judge detections with room for a flipped box "
            "(checker.detections with max_unmatched=), or loosen the tolerance",
            tail=verdict.output_tail,
        )

    def _int8_gate(self) -> Gate:
        """The fully quantized candidate, checked before an int8 search: a failure is what the search assumes."""
        return Gate(
            lambda: self.candidate(frozenset(), "no node kept"),
            False,
            self._none_kept_passed,
            lambda verdict: setattr(self, "_some_failed", True),
        )

    def _none_gate(self) -> Gate:
        return Gate(lambda: self.candidate(frozenset(), "no node kept"), False, self._none_kept_passed)

    def _none_kept_passed(self, verdict: Verdict) -> None:
        log.info("The check passes with every node in %s: no node needs float32", self.low)
        self.final = self.closure(frozenset())

    # -- results --------------------------------------------------------------------------

    def _built_search(self) -> Any:
        """The int8 (or only) stage's search itself: a deferred search's, once built (``DeferredSearch``),
        else the search."""
        return getattr(self._int8_search, "_search", self._int8_search)

    def result(self) -> Dict[str, Any]:
        """``kept_nodes`` (names and op types), ``kept``, ``total``, ``output`` for summary.json; int8's
        ``calibration``, and ``ranked_again`` (nodes, seconds, switched) when the nodes were ranked again;
        the search's own facts (``strategies.precision_facts``)."""
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
        }
