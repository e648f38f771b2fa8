"""``mode=reduce``: shrink a failing ONNX model to a minimal failing subgraph.

Candidates are node sets (see ``runner.graph.subgraph``); ``SetSearch`` with the chosen marker
finds, one round per needed node, a set whose subgraph still fails and from which no single
node can be dropped (under a monotone failure). ``reduce_inputs=false`` closes every candidate
under ancestors (it keeps the original graph inputs), ``reduce_outputs=false`` under
descendants (it keeps the original graph outputs), as Polygraphy's ``--no-reduce-*`` do.

Gates before the search: iteration 1 checks the user's model exactly as given (it must fail),
then the whole model as extraction rewrites it (Constant nodes as initializers); if that passes,
the rewrite hid the failure, so the run says so and keeps Constant nodes as nodes. After the
search, if no check passed, one control candidate without the answer's nodes is checked: a check
that fails on it too fails whatever the model holds, and the run says so instead of naming a
culprit.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import onnx

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker
from runner.checkers.polygraphy_names import SkippedNames
from runner.config import answer_options, save_options
from runner.context import RunContext
from runner.errors import ConfigError, NothingToDoError
from runner.files.repro import write_bundle
from runner.graph.load import load_model, save_model
from runner.graph.meta import TensorMeta
from runner.graph.scope import Scope
from runner.graph.subgraph import GraphIndex
from runner.graph.validate import SubgraphValidator
from runner.graph.weights import MODEL_THRESHOLD, SharedWeights, initializer_bytes
from runner.write_guard import check_write
from strategies.boundary import BoundaryMarker, marker_name
from strategies.gate import Gate
from strategies.mode_keys import ReduceKeys
from strategies.onnx_search import OnnxSearchStrategy, Units
from strategies.reduce_gates import control_units, min_good_set, original_candidate, original_passed
from strategies.set_search import SetSearch

log = logging.getLogger(__name__)


KEYS = ReduceKeys


class ReduceStrategy(OnnxSearchStrategy):
    """Generates subgraph candidates of a model and keeps shrinking the failing ones.

    Args:
        index: the model's node index.
        marker: ``marker(count)`` returns a boundary marker (bisect, linear or minimal).
        reduce_inputs: allow intermediate tensors to become graph inputs.
        reduce_outputs: allow intermediate tensors to become graph outputs.
        output: where the reduced model is written.
        min_good: where the largest passing candidate close in size is written, or None.
        save_opts: ``external_data`` and ``threshold`` for ``save_model``.
        source_files: the user's model file and its external data files; iteration 1 checks a byte
            copy of a single-file model (otherwise, or when empty, the loaded model saved again).
        source_model: the model as loaded, weights included (default: ``index.model``).
        weights: when given, ``index`` was built on its stub and candidate files reference the
            shared weights file instead of holding the bytes.
        bundle_samples: the samples the repro bundle is computed on, or None for no bundle.
        in_scope: the units the search covers (``include_*``/``exclude_*``); the others stay in
            every candidate. None: every unit.
        concrete: the user gave shapes: the answer's own graph inputs and outputs get them in
            place of symbolic dimensions (``output_model``).
        as_run: how the checker runs an fp32 candidate when not as written (its low precision:
            ``CompareChecker.as_run``): the bundle then holds that model too, whose failure the
            bundle's values reproduce on any fp32 runtime.

    Raises:
        ConfigError: when both reductions are off (nothing could change).
    """

    def __init__(
        self,
        index: GraphIndex,
        marker: Callable[[int], BoundaryMarker],
        reduce_inputs: bool = True,
        reduce_outputs: bool = True,
        output: Path = Path("reduced.onnx"),
        min_good: Optional[Path] = None,
        save_opts: Optional[Dict[str, Any]] = None,
        source_files: Sequence[Path] = (),
        source_model: Optional[onnx.ModelProto] = None,
        weights: Optional[SharedWeights] = None,
        bundle_samples: Optional[Callable[[], Sequence[Mapping[str, Any]]]] = None,
        in_scope: Optional[Units] = None,
        concrete: bool = False,
        as_run: Optional[Callable[[onnx.ModelProto], Optional[Tuple[onnx.ModelProto, str]]]] = None,
    ):
        if not reduce_inputs and not reduce_outputs:
            raise ConfigError(
                "reduce_inputs=false and reduce_outputs=false leave nothing to reduce; enable at least one"
            )
        self.index = index
        self.concrete = concrete
        self.reduce_inputs = reduce_inputs
        self.reduce_outputs = reduce_outputs
        self.order = list(index.units) if reduce_outputs else list(reversed(index.units))
        # the scope (include_*/exclude_*): the search stays inside; the nodes outside stay in every candidate
        self.forced: Units = frozenset(index.units) - in_scope if in_scope is not None else frozenset()
        self.order = [u for u in self.order if u not in self.forced]
        super().__init__(SetSearch(self.order, marker), index.units, False, output, save_opts, index.fingerprint)
        self.validator = SubgraphValidator(index.model)
        self.marker_name = marker_name(marker)
        self.min_good = Path(min_good) if min_good else None
        self.min_good_written: Optional[str] = None
        self.source_files = [Path(f) for f in source_files]
        self.source_model = source_model if source_model is not None else index.model
        self.weights = weights
        self.bundle_samples = bundle_samples
        self.as_run = as_run
        self.repro: Dict[str, str] = {}
        self.full = self.universe
        self.passed_any = False
        self._passing: List[Tuple[int, Units]] = []
        #: what to look at when the model as given passes (the checker's ``fix_hint``)
        self.fix_hint = Checker.fix_hint
        #: the compare checker's tolerance as ``polygraphy run`` options, for ``repro_command``
        self.tolerance: Optional[List[str]] = None
        self.gates.extend(
            [
                Gate(self._original, False, lambda verdict: original_passed(verdict, self.fix_hint)),
                Gate(self._rewritten, False, self._rewritten_passed),
            ]
        )

    @classmethod
    def create(
        cls,
        ctx: RunContext,
        keys: ReduceKeys,
        *,
        checker: Optional[Checker] = None,
        marker: Optional[Callable[[int], BoundaryMarker]] = None,
    ) -> ReduceStrategy:
        """Index ``ctx.model`` with concrete tensor shapes (shape inference, else one ONNX Runtime run).

        Args:
            ctx: the run context (model, input shapes, feeds).
            keys: the mode's keys; its scope (``runner.graph.scope``) keeps the search inside it, nodes
                outside stay in every candidate. With ``share_weights`` and a model of ``MODEL_THRESHOLD``
                bytes of initializers or more, the weights are written once to ``<run dir>/weights.bin``
                (``weights_N.bin`` when a file there or the model's own files have that name) and
                candidates reference them.
            checker: the run's checker; with ``checker=compare`` its input and golden values make the
                repro bundle (``runner.files.repro``); other checkers get none.
            marker: the marker factory (``marker=``).

        Raises:
            ModelError: bad model file or graph. ConfigError: bad options.
        """
        model, weights = ctx.model, None
        if marker is None:
            raise ConfigError("mode=reduce needs a marker (marker=bisect, linear, minimal or auto)")
        if keys.share_weights and initializer_bytes(ctx.model) >= MODEL_THRESHOLD:
            weights = SharedWeights(ctx.model, ctx.run_dir, ctx.model_files)
            model = weights.stub(ctx.model)
        meta = TensorMeta(model, ctx.shapes, lambda: ctx.summaries, keys.shape_inference.value)
        index = GraphIndex(model, meta, keep_constant_nodes=keys.keep_constant_nodes)
        compared = checker.compared_tensors() if checker is not None else None
        comparison = checker.comparison() if checker is not None else None
        if keys.compare_every_tensor and not compared:
            raise ConfigError(
                "compare_every_tensor=true is for a `polygraphy run ... --load-outputs FILE` check, which compares "
                "the golden tensors a candidate computes; this check compares none: drop it"
            )
        if compared:
            skipped = None if keys.compare_every_tensor else SkippedNames(compared, set(index.tensor_map))
            marked = index.mark(compared, skipped.names if skipped is not None else None)
            log.info(
                "The check holds golden values of %d tensors of the full model, computed with every tensor an "
                "output: each candidate outputs every one of them it computes, so that it computes them as that "
                "run did (no fusion across them)%s",
                marked,
                ""
                if skipped is None
                else "; those past its boundary under names Polygraphy's matching skips (the check compares "
                "the boundary, as for Polygraphy's own candidates; compare_every_tensor=true compares them all)",
            )
        scope = Scope.from_keys(keys)
        in_scope = None
        if scope.given:
            nodes = {u: [(d["name"], d["op"]) for d in index.describe([u])] for u in index.units}
            in_scope = frozenset(scope.split(nodes)[0])
            log.info(
                "Scope: the search covers %d of %d nodes; the others stay in every candidate", len(in_scope), len(nodes)
            )
        strategy = cls(
            index,
            marker,
            keys.reduce_inputs,
            keys.reduce_outputs,
            Path(keys.output or "reduced.onnx"),
            Path(keys.min_good) if keys.min_good else None,
            save_options(keys),
            ctx.model_files,
            ctx.model,
            weights,
            # the compare checker's values are the check's own; another check decides on its own data, and
            # running the original here could meet the very backend crash being reduced
            comparison.samples if comparison is not None else None,
            in_scope,
            bool(ctx.input_shapes or ctx.inputs or ctx.data_loader),
            comparison.as_run if comparison is not None else None,
        )
        if checker is not None:
            strategy.fix_hint = checker.fix_hint
        if comparison is not None:
            strategy.tolerance = comparison.rule.polygraphy_args()
        strategy.answer_opts = answer_options(keys)
        return strategy

    # -- candidates ---------------------------------------------------------------------------

    def model_for(self, units: Units) -> onnx.ModelProto:
        """The subgraph of ``units`` (closed as the reduction options require) as a model."""
        return self.index.extract(units)

    def size(self, units: Units) -> str:
        """How many nodes the candidate's model holds."""
        return f"{self.index.count_nodes(units)} nodes"

    def variant(self) -> str:
        """Whether Constant nodes are kept as nodes."""
        return "constants-kept" if self.index.keep_constant_nodes else ""

    def never_passed_hint(self) -> Optional[str]:
        """With a scope, every candidate holds the nodes outside it: a failure one of them causes fails
        every candidate, which is the scope's doing, not the check's."""
        if not self.forced:
            return None
        names = [d["name"] for d in self.index.describe(sorted(self.forced)[:3])]
        more = f" and {len(self.forced) - 3} more" if len(self.forced) > 3 else ""
        return (
            f"every candidate holds the {len(self.forced)} node(s) outside the scope ({', '.join(names)}{more}): "
            "a failure one of them causes fails every candidate; widen the scope (include_nodes, exclude_nodes, "
            "include_op_types, exclude_op_types) so the search can drop them"
        )

    def info(self, units: Units) -> Dict[str, Any]:
        """Nodes, units, and the subgraph's boundary tensors."""
        order, inputs, outputs = self.index.boundary(units)
        return {"nodes": self.index.node_count(order), "units": len(units), "inputs": inputs, "outputs": outputs}

    def describe(self, units: Iterable[int]) -> List[Dict[str, str]]:
        """Name and op type of each unit, in topological order."""
        return self.index.describe(units)

    def closure(self, units: Units) -> Units:
        """The candidate for a unit set: closed under ancestors/descendants when a reduction is off.

        Computed on demand by a graph walk (time linear in the nodes reached), not from per-node
        ancestor sets, whose memory grows with the square of the node count.
        """
        out = set(units) | self.forced
        if not self.reduce_inputs:
            out |= self.index.reachable(out, upward=True)
        if not self.reduce_outputs:
            out |= self.index.reachable(out, upward=False)
        return frozenset(out)

    def write_candidate(self, units: Units, model: Callable[[], onnx.ModelProto], path: Path) -> None:
        """With shared weights, the file holds only the graph and references the weights file."""
        if self.weights is None:
            return super().write_candidate(units, model, path)
        self.weights.place(path.parent)
        check_write(path, "a candidate")
        onnx.save_model(model(), str(path))

    def payload(self, model: Callable[[], onnx.ModelProto]) -> Optional[Callable[[], onnx.ModelProto]]:
        """With shared weights, in-process checkers get the bytes read back (once per candidate)."""
        weights = self.weights
        return model if weights is None else functools.cache(lambda: weights.load_into(model()))

    def output_model(self, units: Units) -> onnx.ModelProto:
        """A self-contained model of ``units`` (shared weights read back in). With shapes the user
        gave (``model_input_shapes``, input samples), the model's own graph inputs and outputs get
        them too, in place of symbolic dimensions, when ONNX Runtime loads it so (an If branch
        that a concrete shape makes inconsistent can refuse it; the symbolic form is kept then)."""
        model = self.model_for(units)
        load = self.weights.load_into if self.weights is not None else None
        if self.concrete:
            return self.index.concrete_io(self.closure(units), model, load)
        return load(model) if load is not None else model

    # -- gates --------------------------------------------------------------------------------

    def _original(self) -> Candidate:
        """The user's model exactly as given."""
        return original_candidate(
            self.source_model, self.source_files, self.save_opts, self.fingerprint, len(self.index.nodes)
        )

    def _rewritten(self) -> Candidate:
        kept = "Constant nodes kept" if self.index.keep_constant_nodes else "Constant nodes as initializers"
        return self.candidate(self.full, f"whole model as extracted ({kept})")

    def _rewritten_passed(self, verdict: Verdict) -> None:
        if self.index.keep_constant_nodes:
            raise NothingToDoError(
                "the check fails on your model but passes on the same nodes re-exported by onnx-graphsurgeon, so "
                "no subgraph can show the failure; the failure depends on how the file is written, not on its nodes"
            )
        log.warning(
            "The check fails on your model but passes once its Constant nodes become initializers: the "
            "failure needs Constant nodes, so they are kept as nodes (keep_constant_nodes=true)"
        )
        self.index.keep_constant_nodes = True
        self.gates.appendleft(Gate(self._rewritten, False, self._rewritten_passed))

    def on_search_verdict(self, units: Units, verdict: Verdict) -> None:
        """Note that a check passed (for the control check); keep passing sets only for ``min_good``."""
        if verdict.passed:
            self.passed_any = True
            if self.min_good is not None:
                self._passing.append((len(units), units))

    def after_search(self) -> Optional[Gate]:
        """The closed result; when no check passed, a control candidate of nodes outside it."""
        assert self.final is not None
        self.final = self.closure(self.final)
        control = None if self.passed_any else control_units(self.order, self.final, self.closure)
        if control is None:
            return None
        return Gate(
            lambda: self.candidate(control, "control: nodes outside the answer (no check has passed yet)"),
            True,
            lambda verdict: None,
        )

    @property
    def needs_pass(self) -> bool:  # type: ignore[override]
        """A reduced answer rests on some check passing; the unreduced model itself does not."""
        return self.final is None or self.final != self.closure(self.full)

    # -- results ------------------------------------------------------------------------------

    def finish(self) -> None:
        """Write the reduced model (checked with onnx.checker), its repro bundle with ``checker=compare``
        (``runner.files.repro``) and the min-good model if asked."""
        super().finish()
        if self.bundle_samples is not None:
            reduced = load_model(self.output, "output")
            self.repro = write_bundle(
                self.output, reduced, self.bundle_samples(), self.source_model, self.as_run, self.tolerance
            )
        if self.min_good is not None:
            assert self.final is not None
            good = min_good_set(self.final, self._passing)
            if good is None:
                log.warning("No passing candidate was seen; min_good=%s not written", self.min_good)
            else:
                save_model(self.output_model(good), self.min_good, **self.answer_opts)
                self.min_good_written = str(self.min_good)

    def result(self) -> Dict[str, Any]:
        """``nodes_before``, ``nodes_after``, ``output`` and the nodes kept, for summary.json."""
        assert self.final is not None
        _, inputs, outputs = self.index.boundary(self.final)
        return {
            "nodes_before": len(self.index.nodes),
            "nodes_after": self.index.count_nodes(self.final),
            "compute_nodes_before": len(self.index.units),
            "compute_nodes_after": len(self.final),
            "keep_constant_nodes": self.index.keep_constant_nodes,
            "output": str(self.output),
            "min_good": self.min_good_written,
            "search_rounds": self.search.rounds,
            "marker": self.marker_name,
            "reduced_nodes": self.index.describe(sorted(self.final)),
            "reduced_inputs": inputs,
            "reduced_outputs": outputs,
            # golden tensors the answer outputs under names a `polygraphy run` check skips (its boundary compared)
            **({"renamed_outputs": renamed} if (renamed := self.index.renamed(self.final)) else {}),
            **self.repro,
            **self.answer_outputs(),
            **self.answer_verified(),
        }
