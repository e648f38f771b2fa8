"""An fp32 candidate as a low-precision check runs it: converted (``checker.low_precision``), and rounded
through Casts where the backend emulates the precision."""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import onnx

from runner.errors import ConfigError
from runner.graph.qdq import has_qdq
from runner.graph.validate import converted
from runner.lowp.convert import has_low_precision, to_low_precision
from runner.lowp.emulate import emulate_low_precision
from runner.lowp.precisions import LowPrecision, is_quantized

log = logging.getLogger(__name__)


def lowered(model: onnx.ModelProto, low: LowPrecision, what: str) -> onnx.ModelProto:
    """``model`` converted to ``low`` (every float tensor and weight, graph input/output types kept),
    validated; ``what`` names the model in errors ("iteration 3's candidate").

    Raises:
        ConfigError: ``low`` is int8, which needs a calibration only precision and layerwise compute.
        InvalidCandidateError: the conversion failed or made an invalid model (the tool's defect).
    """
    if is_quantized(low):
        raise ConfigError(
            "checker.low_precision=int8 needs a calibration, which mode=layerwise and mode=precision "
            "(low_precision=int8) compute; in this mode give QDQ models (quantize_static's output)"
        )
    return converted(model, lambda: to_low_precision(model, low), f"the {low} conversion of {what}")


def as_run(
    model: onnx.ModelProto, low: Optional[LowPrecision], emulating: bool
) -> Optional[Tuple[onnx.ModelProto, str]]:
    """How a check in ``low`` runs an fp32 ``model`` when that is not as written: (the model it runs, a
    word for the file name), the conversion rounded through Casts where the backend emulates ``low``
    (``emulating``: any fp32 runtime reproduces it), else the conversion; None when it runs the model as
    it is (no ``low``, int8, or a model already in a low precision or QDQ).

    Raises:
        InvalidCandidateError: the conversion failed (the tool's defect).
    """
    if low is None or is_quantized(low) or has_low_precision(model) or has_qdq(model):
        return None
    converted_model = lowered(model, low, "the answer")
    if emulating:
        return emulate_low_precision(converted_model)[0], f"{low}_emulated"
    return converted_model, low.name


def warn_fp16_on_cpu(model: onnx.ModelProto) -> bool:
    """Warn (and return True) when ``model`` holds fp16 weights, inputs or outputs: ONNX Runtime on CPU
    computes them in fp32 where it lacks fp16 kernels, and can hide overflows; False, silent, otherwise."""
    fp16 = onnx.TensorProto.FLOAT16
    if not any(t.data_type == fp16 for t in model.graph.initializer) and not any(
        v.type.tensor_type.elem_type == fp16 for v in list(model.graph.input) + list(model.graph.output)
    ):
        return False
    log.warning(
        "ONNX Runtime on CPU computes fp16 models in fp32 where it lacks fp16 kernels and can hide "
        "overflows; checker.backend=fp16_emulation shows them"
    )
    return True
