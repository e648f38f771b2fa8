"""The keys of each bundled mode: what a user may set on the command line for it, as dataclasses.

Start-up reads every mode's keys (``runner.config_keys.mode_keys``: the run's schema is their union)
before it knows the mode, so they live here, beside no ONNX or NumPy import: each ``conf/mode/<mode>.yaml``
names its class (``keys:``), and the mode's module exports it as ``KEYS``. A mode whose YAML names no
``keys`` has them read from its module's ``KEYS`` (which imports that module at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from omegaconf import MISSING

from runner.config import (
    BudgetConf,
    BuilderConf,
    CheckedKeys,
    DataKeys,
    Direction,
    Precision,
    QuantKeys,
    SaveKeys,
    ScopeKeys,
    ShapeInference,
    Untie,
    candidate,
)


@dataclass
class RepeatKeys(DataKeys):
    """``mode=repeat``."""

    until: Optional[str] = None


@dataclass
class BuildKeys(CheckedKeys):
    """``mode=build``."""

    model: Optional[str] = None
    model_input_shapes: Any = candidate(None)
    until: Optional[str] = None
    workspace: Optional[int] = candidate(None)
    timing_cache: Optional[str] = None
    builder: BuilderConf = candidate(default_factory=BuilderConf)  # TensorRT builder settings (builder.*)


@dataclass
class DiffTacticsKeys:
    """``mode=diff_tactics``."""

    dir: Optional[str] = None
    good: List[str] = field(default_factory=list)
    bad: List[str] = field(default_factory=list)


@dataclass
class ReduceKeys(DataKeys, SaveKeys, ScopeKeys):
    """``mode=reduce``."""

    #: keys only some options of another key use (``runner.config_keys.check_key_uses``)
    used_with: ClassVar[Dict[str, Tuple[str, Tuple[str, ...]]]] = {
        "compare_every_tensor": ("checker", ("command",)),  # a `polygraphy run --load-outputs` check's
    }

    marker: Any = MISSING
    reduce_inputs: bool = True
    reduce_outputs: bool = True
    min_good: Optional[str] = None
    keep_constant_nodes: bool = candidate(False)  # default: carried Constant nodes become initializers
    share_weights: bool = candidate(True)  # large models: candidates reference one weights file written once per run
    # where subgraph boundaries get types and shapes: onnx (inference, then a run), none, fallback (a run for all)
    shape_inference: ShapeInference = candidate(ShapeInference.onnx)
    # with a `polygraphy run --load-outputs` check: it compares every golden tensor a candidate computes (true),
    # or its boundary (false: the others are output under names Polygraphy's matching skips)
    compare_every_tensor: bool = candidate(False)


@dataclass
class LayerwiseConf:
    """``layerwise.*``: the per-node report."""

    top: int = 10  # nodes in top_introduced and the printed table
    max_memory_mb: Optional[float] = 1024.0  # tensor values held at once; past it, chunks of nodes (null: no limit)
    plot: bool = True  # write layerwise.png


@dataclass
class LayerwiseKeys(DataKeys, QuantKeys, ScopeKeys):
    """``mode=layerwise``."""

    #: keys only some options of another key use (``runner.config_keys.check_key_uses``)
    used_with: ClassVar[Dict[str, Tuple[str, Tuple[str, ...]]]] = {
        "calibration": ("checker.low_precision", ("int8",)),
        "quantization": ("checker.low_precision", ("int8",)),
    }

    reference_model: Optional[str] = None  # compare with this model instead of the model on checker.reference
    layerwise: LayerwiseConf = field(default_factory=LayerwiseConf)


@dataclass
class PrecisionKeys(DataKeys, SaveKeys, QuantKeys, ScopeKeys):
    """``mode=precision``."""

    #: keys only some options of another key use (``runner.config_keys.check_key_uses``)
    used_with: ClassVar[Dict[str, Tuple[str, Tuple[str, ...]]]] = {
        "tie_blocks": ("marker", ("minimal",)),
        "untie": ("marker", ("minimal",)),
        "exchange_checks": ("marker", ("minimal",)),
        "calibration": ("low_precision", ("int8", "float8")),
        "quantization": ("low_precision", ("int8", "float8")),
    }
    #: keys that go with none of others (``runner.config_keys.check_key_uses``): a given quantized model brings
    #: its own precision, placement and scales
    not_with: ClassVar[Dict[str, Tuple[str, ...]]] = {
        "quantized_model": ("low_precision", "calibration", "quantization"),
    }

    marker: Any = MISSING
    direction: Direction = Direction.forward
    precision: Precision = candidate(Precision.float32)
    low_precision: Precision = candidate(Precision.float16)
    # a QDQ model another tool made from model= (ModelOpt, NNCF, ONNX Runtime): the nodes to take out of its int8/fp8
    quantized_model: Optional[str] = candidate(None)
    weak_typing: bool = candidate(False)  # TensorRT <= 10: candidates are engines with layer precisions
    ranking_memory_mb: Optional[float] = 512.0  # tensor values the ranking holds at once; past it, chunks (null: none)
    tie_blocks: bool = True  # marker=minimal on a model that repeats a block: decide each block position once first
    untie: Untie = Untie.auto  # then search kept positions block by block: auto (where it pays), nodes (all), none
    # marker=minimal: checks spent trading two kept nodes for one after the 1-minimal answer (0: none; null: 16
    # for int8, whose rankings leave smaller answers than the 1-minimal one more often, 0 for fp16/bf16)
    exchange_checks: Optional[int] = None
    # stop at budget.checks= checks or budget.seconds= seconds with the best answer checked so far (minimal: false)
    budget: BudgetConf = field(default_factory=BudgetConf)
    rankings: Optional[str] = None  # an earlier run's ranking.json (or its directory): rankings of this key are read

    def checker_defaults(self) -> Dict[str, Any]:
        """Checker options this search defaults where they are left null (``runner.run.plan``): an int8 or fp8
        search with TensorRT's placement, or over a given quantized model, runs its candidates' Q/DQ as written
        (``graph_optimization_level=disable``), and so as feeds of one switched model
        (``runner.lowp.qdq_switchboard``)."""
        low = getattr(self.low_precision, "value", self.low_precision)
        placed = low in ("int8", "float8") and self.quantization.placement == "tensorrt"
        return {"graph_optimization_level": "disable"} if placed or self.quantized_model else {}
