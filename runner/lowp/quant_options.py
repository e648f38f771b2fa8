"""How int8 candidates are calibrated and quantized: the ``calibration.*`` and ``quantization.*`` keys,
checked once (``QuantOptions``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple

from runner.config import QuantKeys
from runner.errors import ConfigError

#: the calibration methods, by config name
METHODS = ("minmax", "entropy", "percentile")
#: the entropy calibrator's histogram: TensorRT's (``IInt8EntropyCalibrator2``: 2048 bins, thresholds
#: searched from 128 quantized bins up); ONNX Runtime's default 128/128 leaves one threshold, the maximum
ENTROPY_BINS, ENTROPY_QUANTIZED_BINS = 2048, 128
#: where Q/DQ go: as TensorRT fuses them (``runner.lowp.placement``), or ONNX Runtime's CPU placement
PLACEMENTS = ("tensorrt", "onnxruntime")
#: what the nodes outside int8 may run in (``quantization.float_precision``)
FLOAT_PRECISIONS = ("float32", "float16")


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
        placement: "tensorrt" (Q/DQ where TensorRT fuses them, ``runner.lowp.placement``) or
            "onnxruntime" (ONNX Runtime's ``QDQQuantizer``, every removable activation kept).
        cache: a calibration cache file (``runner.lowp.calibration_cache``), or None.
        float_precision: what the nodes outside int8 run in: "float32", or "float16" (TensorRT's
            ``--int8 --fp16``: ``runner.lowp.mixed_qdq``, opset 19).
    """

    method: str = "minmax"
    samples: Optional[int] = None
    percentile: float = 99.999
    per_channel: bool = True
    symmetric_activations: bool = True
    op_types_to_quantize: Tuple[str, ...] = field(default_factory=tuple)
    placement: str = "tensorrt"
    cache: Optional[str] = None
    float_precision: str = "float32"

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
        rest = str(getattr(qua.get("float_precision"), "value", qua.get("float_precision") or "float32"))
        if rest not in FLOAT_PRECISIONS:
            raise ConfigError(
                f"quantization.float_precision={rest}: the nodes outside int8 run in float32 or float16 (TensorRT's "
                "--int8 --fp16); use one of those"
            )
        if rest == "float16" and placement != "tensorrt":
            raise ConfigError(
                f"quantization.float_precision=float16 with quantization.placement={placement}: int8 with fp16 is "
                "TensorRT's --int8 --fp16, and ONNX Runtime fuses its own placement's Q/DQ into QLinear kernels that "
                "take float32 scales only; use quantization.placement=tensorrt"
            )
        return cls(
            method,
            None if samples is None else int(samples),
            percentile,
            bool(qua.get("per_channel", True)),
            symmetric,
            ops,
            placement,
            str(cal["cache"]) if cal.get("cache") else None,
            rest,
        )

    @property
    def float16_rest(self) -> bool:
        """Whether the nodes outside int8 run in fp16 (``float_precision=float16``)."""
        return self.float_precision == "float16"

    def op_types(self) -> List[str]:
        """The op types quantized: ``op_types_to_quantize``, or every one the quantizer handles."""
        return list(self.op_types_to_quantize) or quantizable_op_types()


def quantizable_op_types() -> List[str]:
    """Every op type ONNX Runtime's static quantizer handles (its QDQ and QOperator registries, as
    ``quantize_static`` takes them when no list is given), sorted."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QDQRegistry) | set(QLinearOpsRegistry))
