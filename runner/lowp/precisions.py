"""The low precisions the tool converts to, each described once: its ONNX type, range and requirements.

Conversion (``convert``), emulation (``emulate``), the compare checker, layerwise and precision's
ranking all look a precision up here by its name (``low_precision=float16``) instead of spelling
out its type, its largest value or the backend that emulates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional, Union

from onnx import TensorProto

from runner.errors import ConfigError


@dataclass(frozen=True)
class LowPrecision:
    """One low precision.

    Attributes:
        name: its config name, e.g. "float16".
        elem_type: the ONNX element type (``TensorProto.FLOAT16``).
        schema_type: how ONNX operator schemas name it ("tensor(float16)").
        max_finite: its largest finite value (65504 for fp16).
        min_opset: the first default-domain opset with a Cast to it.
        control_flow_opset: the first opset whose If, Loop and Scan carry it.
        emulation: the compare checker's backend that emulates it on CPU ("" for int8).
        quantized: Q/DQ (int8 or float8: Q/DQ pairs around float nodes, calibrated ranges, made by
            ``runner.lowp.quantize``, ``runner.lowp.placement``, ``runner.lowp.fp8``), not a float type nodes are
            cast to.
        maker: the kind of candidate maker that makes its candidates (``runner.lowp.makers.MAKERS``): "casts",
            "qdq" or "fp8".

    ``str()`` gives ``name``: a precision reads as its config name in messages and keys.
    """

    name: str
    elem_type: int
    schema_type: str
    max_finite: float
    min_opset: int
    control_flow_opset: int
    emulation: str
    quantized: bool = False
    maker: str = "casts"

    def __str__(self) -> str:
        return self.name


FLOAT16 = LowPrecision("float16", TensorProto.FLOAT16, "tensor(float16)", 65504.0, 1, 1, "fp16_emulation")
BFLOAT16 = LowPrecision(
    "bfloat16", TensorProto.BFLOAT16, "tensor(bfloat16)", 3.3895313892515355e38, 13, 16, "bf16_emulation"
)

#: the quantized low precision: int8 QDQ, made by ``runner.lowp.quantize`` rather than by casting; a
#: float type it is not, so it is not among ``LOW_PRECISIONS``
INT8 = LowPrecision("int8", TensorProto.INT8, "tensor(int8)", 127.0, 13, 13, "", quantized=True, maker="qdq")

#: fp8 (E4M3) as TensorRT deploys it on Hopper: Q/DQ to float8e4m3fn at opset 19 (``runner.lowp.fp8``), calibrated
#: by its maximum; quantized like int8, so not among ``LOW_PRECISIONS`` either
FLOAT8 = LowPrecision(
    "float8", TensorProto.FLOAT8E4M3FN, "tensor(float8e4m3fn)", 448.0, 19, 19, "", quantized=True, maker="fp8"
)
#: the quantized low precisions, by name
QUANTIZED: Dict[str, LowPrecision] = {p.name: p for p in (INT8, FLOAT8)}

#: every low precision nodes are cast to, by name
LOW_PRECISIONS: Dict[str, LowPrecision] = {p.name: p for p in (FLOAT16, BFLOAT16)}
#: their ONNX element types
LOW_TYPES: FrozenSet[int] = frozenset(p.elem_type for p in LOW_PRECISIONS.values())


def low_precision(name: Union[str, LowPrecision], option: str = "low_precision") -> LowPrecision:
    """The float precision called ``name`` (one nodes are cast to; a ``LowPrecision`` is looked up by its name).

    Raises:
        ConfigError: no such float low precision, int8 included (``option`` names the key in the message).
    """
    found = LOW_PRECISIONS.get(str(name))
    if found is None:
        raise ConfigError(f"{option}={name}: use one of {', '.join(LOW_PRECISIONS)}")
    return found


def any_low_precision(name: Any, option: str = "low_precision") -> Optional[LowPrecision]:
    """The low precision a config value names: float16, bfloat16, int8 or float8 (a ``runner.config.Precision``
    member or its name; None for None).

    Raises:
        ConfigError: any other name, float32 included (``option`` names the key in the message).
    """
    if name is None or isinstance(name, LowPrecision):
        return name
    name = str(getattr(name, "value", name))
    found = LOW_PRECISIONS.get(name) or QUANTIZED.get(name)
    if found is None:
        raise ConfigError(f"{option}={name}: use one of {', '.join([*LOW_PRECISIONS, *QUANTIZED])}")
    return found


def emulated_by(backend: str) -> Optional[LowPrecision]:
    """The precision a compare backend emulates (``fp16_emulation`` -> float16), or None."""
    return next((p for p in LOW_PRECISIONS.values() if p.emulation == backend), None)


def is_quantized(precision: Union[str, LowPrecision, None]) -> bool:
    """Whether ``precision`` (or the precision of that name) is Q/DQ (int8 or float8: quantized, not cast); False
    for None."""
    if isinstance(precision, LowPrecision):
        return precision.quantized
    return precision in QUANTIZED
