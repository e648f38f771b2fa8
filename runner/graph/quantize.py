"""int8 QDQ candidates: ONNX Runtime's static quantizer, calibrated once per run.

``quantize_static`` calibrates every time it is called: a precision search that called it per
candidate would pay a calibration (a run of the model over every sample with every tensor an
output) per check. Here the two halves it is made of are called apart, as ONNX Runtime's
``quantize_static`` calls them (``onnxruntime/python/tools/quantization/quantize.py``):

- ``calibrate`` runs ONNX Runtime's calibrator (``create_calibrator``: min/max, entropy or
  percentile) once over the samples and keeps the activation ranges (``TensorsData``);
- ``Quantizer.convert(kept)`` hands those ranges to ``QDQQuantizer`` with ``nodes_to_exclude=kept``
  for each candidate: a second or so on the 672-node detector, no model run.

A kept node stays float with its tensors: ONNX Runtime's quantizer excludes the node, but a tensor
it shares with a quantized reader still reaches it through that reader's Q/DQ pair, and a weight it
shares is stored int8; ``Quantizer.convert`` wires the kept node back to the float tensor and the
float weight, so keeping a node removes every rounding of its inputs.

The QDQ model written is what TensorRT builds strongly typed (symmetric int8, zero points 0, per-
channel weights) and what ONNX Runtime runs on CPU.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.config import QuantKeys
from runner.errors import ArtifactError, ConfigError, ModelError, first_line
from runner.graph.convert import raise_opset
from runner.graph.feeds import as_declared, graph_inputs
from runner.graph.isolate import outer_reads
from runner.graph.load import as_file
from runner.graph.meta import infer_shapes
from runner.graph.qdq import is_qdq

log = logging.getLogger(__name__)

#: per-channel DequantizeLinear (its ``axis``) needs opset 13
INT8_OPSET = 13
#: the calibration methods, by config name
METHODS = ("minmax", "entropy", "percentile")
#: the entropy calibrator's histogram: TensorRT's (``IInt8EntropyCalibrator2``: 2048 bins, thresholds
#: searched from 128 quantized bins up); ONNX Runtime's default 128/128 leaves one threshold, the maximum
ENTROPY_BINS, ENTROPY_QUANTIZED_BINS = 2048, 128
#: where Q/DQ go: as TensorRT fuses them (``runner.graph.placement``), or ONNX Runtime's CPU placement
PLACEMENTS = ("tensorrt", "onnxruntime")


@dataclass(frozen=True)
class QuantOptions:
    """How candidates are quantized (``calibration.*`` and ``quantization.*``).

    Attributes:
        method: the calibration method: minmax, entropy or percentile (ONNX Runtime's calibrators).
        samples: how many of the run's input samples calibrate (the first ones); None: all.
        percentile: the percentile of |value| the percentile method keeps (e.g. 99.999).
        per_channel: weights get one scale per output channel (TensorRT's default for Conv/Gemm).
        symmetric_activations: activations int8 with zero point 0 (what TensorRT takes); else
            uint8 with a zero point (ONNX Runtime's CPU default).
        op_types_to_quantize: only nodes of these op types are quantized; empty: every op type
            ONNX Runtime's QDQ quantizer handles.
        placement: "tensorrt" (Q/DQ where TensorRT fuses them, ``runner.graph.placement``) or
            "onnxruntime" (ONNX Runtime's ``QDQQuantizer``, every removable activation kept).
    """

    method: str = "minmax"
    samples: Optional[int] = None
    percentile: float = 99.999
    per_channel: bool = True
    symmetric_activations: bool = True
    op_types_to_quantize: Tuple[str, ...] = field(default_factory=tuple)
    placement: str = "tensorrt"

    @classmethod
    def from_keys(cls, keys: QuantKeys) -> QuantOptions:
        """``from_config`` of a mode's ``calibration`` and ``quantization`` keys (``runner.config.QuantKeys``).

        Raises:
            ConfigError: as ``from_config``.
        """
        return cls.from_config(dataclasses.asdict(keys.calibration), dataclasses.asdict(keys.quantization))

    @classmethod
    def from_config(
        cls, calibration: Optional[Mapping[str, Any]], quantization: Optional[Mapping[str, Any]]
    ) -> QuantOptions:
        """Options from the ``calibration`` and ``quantization`` config maps.

        Raises:
            ConfigError: an unknown method, a sample count below 1, a percentile outside (0, 100],
                or an op type ONNX Runtime's quantizer does not quantize.
        """
        cal, qua = dict(calibration or {}), dict(quantization or {})
        method = str(cal.get("method", "minmax"))
        if method not in METHODS:
            raise ConfigError(f"calibration.method={method}: use one of {', '.join(METHODS)}")
        samples = cal.get("samples")
        if samples is not None and int(samples) < 1:
            raise ConfigError(f"calibration.samples={samples}: give 1 or more, or null for every sample")
        percentile = float(cal.get("percentile", 99.999))
        if not 0 < percentile <= 100:
            raise ConfigError(f"calibration.percentile={percentile}: give a percentile in (0, 100], e.g. 99.999")
        placement = str(qua.get("placement", "tensorrt"))
        if placement not in PLACEMENTS:
            raise ConfigError(
                f"quantization.placement={placement}: use tensorrt (Q/DQ where TensorRT fuses them) or onnxruntime "
                "(ONNX Runtime's CPU placement)"
            )
        symmetric = bool(qua.get("symmetric_activations", True))
        if placement == "tensorrt" and not symmetric:
            raise ConfigError(
                "quantization.symmetric_activations=false makes uint8 activations with zero points, which TensorRT "
                "does not take: use quantization.placement=onnxruntime with it"
            )
        ops = tuple(str(o) for o in (qua.get("op_types_to_quantize") or ()))
        unknown = sorted(set(ops) - set(quantizable_op_types()))
        if unknown:
            raise ConfigError(
                f"quantization.op_types_to_quantize names {unknown}, which ONNX Runtime's QDQ quantizer does not "
                f"quantize; use some of {', '.join(sorted(quantizable_op_types()))}"
            )
        return cls(
            method,
            None if samples is None else int(samples),
            percentile,
            bool(qua.get("per_channel", True)),
            symmetric,
            ops,
            placement,
        )

    def op_types(self) -> List[str]:
        """The op types quantized: ``op_types_to_quantize``, or every one the quantizer handles."""
        return list(self.op_types_to_quantize) or quantizable_op_types()


def quantizable_op_types() -> List[str]:
    """Every op type ONNX Runtime's static quantizer handles (its QDQ and QOperator registries, as
    ``quantize_static`` takes them when no list is given), sorted."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QDQRegistry) | set(QLinearOpsRegistry))


def prepare_int8(model: onnx.ModelProto, in_place: bool = False) -> onnx.ModelProto:
    """``model`` made ready for ``calibrate`` and ``Quantizer``: opset 13 or newer (raised with a log
    line; per-channel DequantizeLinear needs it), nodes named, Constant nodes as initializers (the
    quantizer quantizes weights and biases only when they are initializers). A copy, or ``model``
    itself with ``in_place`` when its opset is new enough (``prepare``).

    Raises:
        ModelError: ONNX's version converter cannot raise the opset.
    """
    from runner.graph.convert import prepare
    from runner.graph.precisions import FLOAT16

    raised = raise_opset(model, INT8_OPSET, "int8 QDQ with per-channel weights")
    return prepare(raised, FLOAT16, in_place=in_place or raised is not model)  # names and initializers


def _quieter(record: logging.LogRecord) -> bool:
    """A filter for the root logger: ONNX Runtime's quantizer logs its notes there ("Axis 1 is
    out-of-range for weight ...", once per candidate); they go to this module's debug log instead."""
    if "onnxruntime" in record.pathname and "quantization" in record.pathname:
        log.debug("onnxruntime.quantization: %s", record.getMessage())
        return False
    return True


logging.getLogger().addFilter(_quieter)


class _Reader:
    """Feeds ONNX Runtime's calibrator the samples, each cast to its graph input's declared type,
    and counts the passes made over them (``CalibrationDataReader``'s interface: ``get_next``)."""

    def __init__(self, samples: Sequence[Mapping[str, np.ndarray]], types: Mapping[str, int]):
        self.samples, self.types = samples, types
        self._it: Optional[Iterator[Mapping[str, np.ndarray]]] = None

    def get_next(self) -> Optional[Dict[str, np.ndarray]]:
        if self._it is None:
            self._it = iter(self.samples)
        feeds = next(self._it, None)
        if feeds is None:
            return None
        return {k: as_declared(np.asarray(v), self.types[k]) for k, v in feeds.items()}

    def __len__(self) -> int:
        return len(self.samples)


@dataclass
class Calibration:
    """Activation ranges computed once for a run.

    Attributes:
        ranges: ONNX Runtime's ``TensorsData`` (a range per calibrated tensor).
        method: the calibration method's config name.
        samples: how many samples were run.
        seconds: wall time of the calibration run.
    """

    ranges: Any
    method: str
    samples: int
    seconds: float

    def summary(self) -> Dict[str, Any]:
        """``summary.json``'s ``calibration`` field."""
        return {
            "method": self.method,
            "samples": self.samples,
            "tensors": len(self.ranges.data),
            "seconds": round(self.seconds, 3),
        }


def check_samples(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Calibration input fit for ``model``.

    Raises:
        ConfigError: no samples, a sample missing a graph input or naming a tensor that is none,
            or a model without float graph inputs or float tensors to quantize.
    """
    if not samples:
        raise ConfigError("calibration has no input samples; give inputs=FILE.json (several samples) or data_loader=")
    names = [i.name for i in graph_inputs(model)]
    for k, feeds in enumerate(samples):
        missing = sorted(set(names) - set(feeds))
        extra = sorted(set(feeds) - set(names))
        if missing or extra:
            raise ConfigError(
                f"calibration sample {k} gives {sorted(feeds)} but the model takes {names}; "
                "name each sample's arrays after the model's inputs"
            )
        for name, value in feeds.items():
            array = np.asarray(value)
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                bad = int(array.size - np.isfinite(array).sum())
                raise ConfigError(
                    f"calibration sample {k}'s input {name} holds {bad} NaN/Inf of {array.size} values: activation "
                    "ranges cannot be calibrated on them; give finite samples (inputs= or data_loader=)"
                )


def calibrate(
    model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]], options: QuantOptions
) -> Calibration:
    """Run ONNX Runtime's calibrator once over ``samples`` (the first ``options.samples``).

    Args:
        model: the fp32 model (opset 13+, ``prepare_int8``).
        samples: input feed dicts.
        options: the calibration method and op types.

    Returns:
        The ranges of every tensor a quantized node reads or writes.

    Raises:
        ConfigError: bad calibration input (``check_samples``).
        ModelError: ONNX Runtime cannot run the calibration.
    """
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    check_samples(model, samples)
    used = list(samples[: options.samples] if options.samples else samples)
    types = {i.name: i.type.tensor_type.elem_type for i in graph_inputs(model)}
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy}.get(
        options.method, CalibrationMethod.Percentile
    )
    extra: Dict[str, Any] = {"symmetric": options.symmetric_activations}
    if options.method == "percentile":
        extra["percentile"] = options.percentile
    if (
        options.method == "entropy"
    ):  # ONNX Runtime's default of 128 bins leaves 128 quantized bins one threshold: minmax
        extra.update(num_bins=ENTROPY_BINS, num_quantized_bins=ENTROPY_QUANTIZED_BINS)
    start = time.perf_counter()
    with as_file(model) as path:
        tmp = path.parent
        try:
            calibrator = create_calibrator(
                path,
                options.op_types(),
                augmented_model_path=str(tmp / "augmented.onnx"),
                calibrate_method=method,
                use_external_data_format=True,
                providers=["CPUExecutionProvider"],
                extra_options=extra,
            )
            calibrator.collect_data(_Reader(used, types))
            ranges = calibrator.compute_data()
        except (ConfigError, KeyboardInterrupt):
            raise
        except Exception as e:  # onnxruntime raises Fail/InvalidArgument/ValueError from its calibrators
            first = first_line(e)
            if isinstance(e, OSError) or any(w in first.lower() for w in ("write", "no space", "too large")):
                raise ArtifactError(
                    f"ONNX Runtime cannot write its calibration model in {tmp} ({first}): set TMPDIR to a directory "
                    "with room for two copies of the model"
                ) from None
            raise ModelError(
                f"ONNX Runtime cannot calibrate the model ({first}); check the calibration input"
            ) from None
    if not ranges.data:
        raise ConfigError(
            "calibration found no float tensor to quantize (an integer-only model, or op_types_to_quantize "
            "matches no node); int8 quantization does not apply"
        )
    cal = Calibration(ranges, options.method, len(used), time.perf_counter() - start)
    log.info(
        "Calibrated %d tensors on %d samples (%s) in %.1f s; every candidate reuses these ranges",
        len(ranges.data),
        cal.samples,
        options.method,
        cal.seconds,
    )
    return cal


def make_quantizer(model: onnx.ModelProto, calibration: Calibration, options: QuantOptions) -> Any:
    """The candidate builder ``options.placement`` names: ``runner.graph.placement.PlacedQuantizer``
    (tensorrt) or ``Quantizer`` (onnxruntime); both have ``convert(kept)``, ``calibration``, ``model``.

    Raises:
        ModelError: shape inference fails on the model.
    """
    if options.placement == "tensorrt":
        from runner.graph.placement import PlacedQuantizer

        return PlacedQuantizer(model, calibration, options)
    return Quantizer(model, calibration, options)


class Quantizer:
    """Builds QDQ candidates of one model from one calibration, as ONNX Runtime's quantizer places them.

    Args:
        model: the fp32 model, opset 13+, nodes named, Constant nodes as initializers.
        calibration: the run's ranges (``calibrate``).
        options: per-channel weights, symmetric activations, op types.

    Raises:
        ModelError: shape inference fails on the model.
    """

    def __init__(self, model: onnx.ModelProto, calibration: Calibration, options: QuantOptions):
        self.model, self.calibration, self.options = model, calibration, options
        try:
            self.inferred = infer_shapes(model)  # the quantizer reads tensor types from value_info
        except Exception as e:  # onnx's inference raises InferenceError/ValidationError
            raise ModelError(f"shape inference fails on the model before quantization: {first_line(e)}") from None
        self.nodes = {n.name: n for n in model.graph.node}
        self.inits = {i.name: i for i in model.graph.initializer}
        self._last: Dict[Tuple[str, ...], onnx.ModelProto] = {}  # the fully quantized model and the last one

    def convert(self, kept: Sequence[str]) -> onnx.ModelProto:
        """The model quantized to QDQ except the nodes named in ``kept``, which stay float with
        their inputs and weights. A new copy each call; the fully quantized model and the last
        one made are kept (the gates, the ranking and the answer ask for them again).

        Raises:
            ModelError: ONNX Runtime's quantizer fails on the model.
        """
        key = tuple(sorted(kept))
        if key not in self._last:
            built = self._convert(kept)
            self._last = {k: v for k, v in self._last.items() if not k} | {key: built}
        out = onnx.ModelProto()
        out.CopyFrom(self._last[key])
        return out

    def _convert(self, kept: Sequence[str]) -> onnx.ModelProto:
        from onnxruntime.quantization import QDQQuantizer, QuantType

        work = onnx.ModelProto()
        work.CopyFrom(self.inferred)
        activation = QuantType.QInt8 if self.options.symmetric_activations else QuantType.QUInt8
        extra = {
            "ActivationSymmetric": self.options.symmetric_activations,
            "WeightSymmetric": True,
            "QDQKeepRemovableActivations": True,  # every node of the model stays, kept or not
        }
        try:
            quantizer = QDQQuantizer(
                work,
                self.options.per_channel,
                False,
                QuantType.QInt8,
                activation,
                self.calibration.ranges,
                None,
                list(kept),
                self.options.op_types(),
                extra,
            )
            quantizer.quantize_model()
        except KeyboardInterrupt:
            raise
        except Exception as e:  # the quantizer raises ValueError/KeyError/AssertionError on models it cannot handle
            first = first_line(e)
            raise ModelError(f"ONNX Runtime's QDQ quantizer fails on the model ({first})") from None
        quantizer.model.topological_sort()  # it appends Q/DQ nodes (its save_model_to_file sorts too)
        out: onnx.ModelProto = quantizer.model.model
        self._float_inputs(out, set(kept))
        del out.graph.value_info[:]  # inferred before quantization; Q/DQ renamed what they describe
        return out

    def _float_inputs(self, model: onnx.ModelProto, kept: set) -> None:
        """Wire each kept node's inputs back to the float tensors and weights of the original, then
        drop the Q/DQ nodes and initializers nothing reads any more."""
        if not kept:
            return
        g = model.graph
        produced = {o for n in g.node for o in n.output} | {i.name for i in g.input}
        present = {i.name for i in g.initializer}
        for node in g.node:
            if node.name not in kept or node.name not in self.nodes:
                continue
            original = self.nodes[node.name]
            for k, name in enumerate(original.input):
                if k >= len(node.input) or node.input[k] == name or not name:
                    continue
                if name not in produced and name not in present:
                    if name not in self.inits:
                        continue
                    g.initializer.append(self.inits[name])
                    present.add(name)
                node.input[k] = name
        _drop_unread(model)


def _drop_unread(model: onnx.ModelProto) -> None:
    """Remove Q/DQ nodes whose outputs nothing reads (repeatedly), then unread initializers."""
    g = model.graph
    outputs = {o.name for o in g.output}
    while True:
        read = {i for n in g.node for i in n.input} | outputs | outer_reads(g)
        dead = [k for k, n in enumerate(g.node) if is_qdq(n) and not any(o in read for o in n.output)]
        if not dead:
            break
        for k in reversed(dead):
            del g.node[k]
    read = {i for n in g.node for i in n.input} | outer_reads(g)
    keep = [i for i in g.initializer if i.name in read]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
