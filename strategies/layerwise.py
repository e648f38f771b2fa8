"""``mode=layerwise``: compare every tensor of the target with the reference, and measure the error
each node introduces (``runner.layerwise``).

A report, not a search: no candidates are checked. The compare checker's options say how: the
target runs on ``checker.backend`` (an fp32 model under fp16/bf16 emulation, or with
``checker.low_precision``, runs converted, as ``checker=compare`` runs it), the reference on
``checker.reference``, and the first divergence is the first tensor outside the checker's
tolerance. ``reference_model=`` compares the model with another one (e.g. an fp16, QDQ or edited
model against its fp32 original), tensors matched by name, through a conversion's Casts and
through Q/DQ pairs. ``checker.low_precision=int8`` quantizes an fp32 model to QDQ first, calibrated
on the run's samples (``calibration.*``, ``quantization.*``, as ``mode=precision
low_precision=int8`` does). A QDQ target also gets ``quantization.csv``: each Q/DQ pair's own
error and SQNR.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Dict, List, Optional, Set, Tuple

import onnx

from runner import malloc
from runner.backends.base import make_backend, onnxruntime_options
from runner.checkers.base import Checker
from runner.checkers.compare.comparison import Comparison
from runner.context import RunContext
from runner.errors import ArtifactError, ConfigError, ModelError
from runner.graph.feeds import graph_inputs
from runner.graph.load import load_model
from runner.graph.qdq import compute_nodes, has_qdq
from runner.graph.scope import Scope
from runner.graph.validate import converted
from runner.layerwise.compute import LayerwiseComparison, NodeRow
from runner.layerwise.quant_report import pair_summary, write_pairs_csv
from runner.layerwise.ranking import lost
from runner.layerwise.report import absorbed, describe, diverges, first_divergence, plot, ranked, table, write_csv
from runner.layerwise.tensors import weight_peaks
from runner.lowp.calibration import Calibration, calibrate
from runner.lowp.convert import has_low_precision, name_nodes, to_low_precision
from runner.lowp.precisions import is_quantized
from runner.lowp.quant_options import QuantOptions
from runner.lowp.quantize import make_quantizer, prepare_int8
from runner.terminal import console
from strategies.base import Report
from strategies.mode_keys import LayerwiseKeys

log = logging.getLogger(__name__)


KEYS = LayerwiseKeys


class LayerwiseStrategy(Report):
    """Per-node accumulated and introduced error of a target against a reference.

    Args:
        ctx: the run context (model, input samples, run directory).
        comparison: the compare checker's backend, reference, tolerances and low precision (``Checker.comparison``).
        reference_model: a model to compare against, or None for the model itself on the reference.
        top: how many nodes ``top_introduced`` and the printed table hold.
        max_memory_mb: the budget in MiB for tensor values held at once; past it values are
            compared in chunks of nodes. None: no limit.
        plot: whether to write ``layerwise.png``.
        quant: int8's calibration and quantization options (``checker.low_precision=int8``).
        scope: which nodes get rows (``include_*``/``exclude_*``, ``runner.graph.scope``).
    """

    def __init__(
        self,
        ctx: RunContext,
        comparison: Comparison,
        reference_model: Optional[str],
        top: int,
        max_memory_mb: Optional[float],
        plot: bool,
        quant: Optional[QuantOptions] = None,
        scope: Optional[Scope] = None,
    ):
        self.ctx, self.comparison, self.reference_model = ctx, comparison, reference_model
        self.top, self.max_memory_mb, self.plot = top, max_memory_mb, plot
        self.quant = quant or QuantOptions()
        self.calibration: Optional[Calibration] = None
        self.scope = scope or Scope()
        self.rows: List[NodeRow] = []
        self.outcome: Dict[str, Any] = {}

    @classmethod
    def create(
        cls,
        ctx: RunContext,
        keys: LayerwiseKeys,
        *,
        checker: Optional[Checker] = None,
        marker: Any = None,
    ) -> LayerwiseStrategy:
        """Build from the mode's keys and the run's compare checker (no marker).

        Raises:
            ConfigError: a checker other than compare, ``golden=`` (the reference is run, not
                loaded), ``layerwise.top`` below 1 or ``layerwise.max_memory_mb`` not positive,
                bad ``calibration.*``/``quantization.*``.
        """
        comparison = checker.comparison() if checker is not None else None
        if comparison is None:
            raise ConfigError("mode=layerwise compares tensors in-process; use checker=compare (its default)")
        if keys.golden:
            raise ConfigError(
                "mode=layerwise runs the reference itself and needs every tensor; drop golden= "
                "(reference_model=FILE compares with another model)"
            )
        top, budget = int(keys.layerwise.top), keys.layerwise.max_memory_mb
        if top < 1:
            raise ConfigError(f"layerwise.top={top}; give 1 or more")
        if budget is not None and not float(budget) > 0:
            raise ConfigError(f"layerwise.max_memory_mb={budget}; give a positive number of MiB, or null for no limit")
        quant, scope = QuantOptions.from_keys(keys), Scope.from_keys(keys)
        if quant.float16_rest:
            raise ConfigError(
                "quantization.float_precision=float16 applies to mode=precision (int8 with the rest in fp16); "
                "mode=layerwise quantizes nodes one at a time against float32: drop it"
            )
        return cls(ctx, comparison, keys.reference_model, top, budget, keys.layerwise.plot, quant, scope)

    def _excluded(self, model: onnx.ModelProto) -> Set[str]:
        """``checker.exclude_outputs``: tensors left out of the comparison (every tensor is compared here, as
        Polygraphy's ``--mark all``): an intermediate one is not compared, a graph output's divergence is no
        first divergence.

        Raises:
            ConfigError: a name that no node of the model computes, or every graph output.
        """
        excluded = set(self.comparison.exclude_outputs)
        outputs = [o.name for o in model.graph.output]
        computed = {o for n in model.graph.node for o in n.output if o}
        unknown = sorted(excluded - computed - set(outputs))
        if unknown:
            raise ConfigError(
                f"checker.exclude_outputs names {unknown}, which no node of the model computes (its outputs: "
                f"{outputs}); name tensors of the model"
            )
        if outputs and excluded >= set(outputs):
            raise ConfigError(
                f"checker.exclude_outputs={sorted(excluded)} leaves none of the graph outputs {outputs}; exclude fewer"
            )
        return excluded

    def _models(self) -> Tuple[onnx.ModelProto, onnx.ModelProto, onnx.ModelProto]:
        """(reference; the target as given, nodes named; the target as the backend runs it)."""
        model = name_nodes(self.ctx.model, in_place=True)  # the run's own model: no copy
        reference = model
        if self.reference_model:
            reference = name_nodes(load_model(self.reference_model, "reference_model"), in_place=True)
            ours = sorted(i.name for i in graph_inputs(model))
            theirs = sorted(i.name for i in graph_inputs(reference))
            if ours != theirs:
                raise ConfigError(
                    f"reference_model={self.reference_model} takes inputs {theirs} but the model takes {ours}; "
                    "compare models with the same inputs"
                )
        low = self.comparison.low
        target = model
        if has_qdq(model) and not self.reference_model:
            raise ConfigError(
                f"{self.ctx.model_path} is a QDQ (quantized) model: give its float original as reference_model=FILE "
                "to compare with, or give the float model with checker.low_precision=int8"
            )
        if is_quantized(low) and not has_qdq(model):
            if not self.ctx.inputs and not self.ctx.data_loader:
                raise ConfigError(
                    "checker.low_precision=int8 calibrates activation ranges on real input: give inputs=FILE.json "
                    "(several samples) or data_loader=module.function"
                )
            model = prepare_int8(model)
            reference = model if not self.reference_model else reference
            self.calibration = calibrate(model, self.ctx.samples, self.quant)
            log.info(
                "The target is the model quantized to int8 QDQ (the run's calibration), as mode=precision builds it"
            )
            return reference, model, make_quantizer(model, self.calibration, self.quant).convert([])
        if low is not None and not is_quantized(low) and not has_low_precision(model):
            log.info("The target holds no %s tensors: it runs converted to %s, as TensorRT's --fp16 would", low, low)
            target = converted(model, lambda: to_low_precision(model, low), f"the {low} conversion of the model")
        return reference, model, target

    def finish(self) -> None:
        """Compare, then write ``layerwise.csv``, ``layerwise.png`` and print the table.

        Raises:
            ModelError: the model has no compute nodes; a backend cannot run the reference or the
                target; ``reference_model=`` cannot be loaded.
            ConfigError: ``reference_model=`` takes other inputs than the model.
            ArtifactError: the CSV or the plot cannot be written.
        """
        reference, given, target = self._models()
        malloc.trim()  # what the conversion made and dropped goes back to the system
        compute = compute_nodes(given)
        if self.scope.given:
            self.scope.check([(n.name, n.op_type) for n in compute])
        rows_of = {n.name for n in compute if self.scope.selects(n.name, n.op_type)}
        if not rows_of:
            raise ModelError(
                f"{self.ctx.model_path} has no nodes that compute (its graph is empty or only constants); "
                "there is no layer to compare"
            )
        name = self.comparison.reference_name
        # every tensor is marked: a session's CPU arena would keep all the values of a run after it
        ref_options = onnxruntime_options(
            name, providers=self.comparison.providers, graph_optimization_level="disable", cpu_arena=False
        )
        ref_backend = make_backend(name, **ref_options)
        target_backend = self.comparison.backend()
        budget = None if self.max_memory_mb is None else int(float(self.max_memory_mb) * 2**20)
        try:
            comparison = LayerwiseComparison(
                reference,
                target,
                rows_of,
                weight_peaks(given),
                ref_backend.run,
                target_backend,
                self.comparison.rule,
                self.comparison.low,
                budget,
                self.ctx.tensor_sizes(reference) if budget is not None else None,
                excluded=self._excluded(given),
            )
            samples = self.ctx.samples
            self.rows = comparison.run(samples)
        finally:
            ref_backend.close()
            target_backend.close()
        by_name = {r.node: r for r in self.rows}
        # In a QDQ target every tensor carries rounding noise, whose relative size dips under the tolerance
        # after a residual Add and rises again: only NaN/Inf or lost values count there (precision's rule)
        divergence = lost if has_qdq(target) else diverges
        for name, by in comparison.absorbed(self.rows, divergence).items():
            by_name[name].absorbed_by = by if by is not None else "(nothing reads it)"
        first = first_divergence(self.rows)
        top = ranked(self.rows)[: self.top]
        run_dir = self.ctx.run_dir
        csv_path, png_path = run_dir / "layerwise.csv", run_dir / "layerwise.png"
        pairs = comparison.pair_rows()
        pairs_path = run_dir / "quantization.csv"
        try:
            write_csv(csv_path, self.rows)
            if pairs:
                write_pairs_csv(pairs_path, pairs)
            if self.plot:
                plot(png_path, self.rows, first, top)
        except OSError as e:
            raise ArtifactError(f"cannot write the layerwise report in {run_dir} ({e.strerror})") from None
        with contextlib.suppress(OSError, ValueError):
            console.result(lambda: print(table(self.rows, self.top, first), file=sys.stdout, flush=True))
        self.outcome = {
            "nodes": len(self.rows),
            "tensors_compared": sum(1 for r in self.rows for _ in r.outputs if r.accumulated),
            "samples": len(samples),
            "first_divergence": describe(first) if first is not None else None,
            "absorbed": absorbed(self.rows),
            "top_introduced": [describe(r) for r in top],
            "target": self.comparison.backend_name + (f" ({self.comparison.low})" if self.comparison.low else ""),
            "reference": self.reference_model or self.comparison.reference_name,
            "csv": str(csv_path),
            "plot": str(png_path) if self.plot else None,
        }
        if pairs:
            ops = {n.name: n.op_type for n in target.graph.node}
            self.outcome["quantization"] = {**pair_summary(pairs, self.top, ops), "csv": str(pairs_path)}
        if self.calibration is not None:
            self.outcome["calibration"] = self.calibration.summary()

    def result(self) -> Dict[str, Any]:
        """``summary.json`` fields: ``nodes``, ``tensors_compared``, ``first_divergence``, ``top_introduced``, ..."""
        return dict(self.outcome)
