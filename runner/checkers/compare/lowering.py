"""An fp32 candidate as a low-precision check runs it: converted (``checker.low_precision``), and rounded
through Casts where the backend emulates the precision; ``Lowering`` does it for each check of a run."""

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


class Lowering:
    """How the compare checker turns each candidate into the model it runs, logging and warning once a run.

    Args:
        low: the low precision fp32 candidates run in (``checker.low_precision``, or implied by an
            emulating backend), or None.
        emulating: whether the backend emulates ``low`` by rounding through Casts (fp16_emulation, bf16_emulation).
        warn_on_cpu: whether the backend is ONNX Runtime on CPU only, which computes fp16 in fp32 where it lacks
            fp16 kernels (a candidate with fp16 tensors is warned of, once a run).
    """

    def __init__(self, low: Optional[LowPrecision], emulating: bool, warn_on_cpu: bool):
        self.low, self.emulating = low, emulating
        self._said_converting = False
        self._to_warn = warn_on_cpu  # until a candidate with fp16 tensors was warned of

    def run_model(self, model: onnx.ModelProto, as_typed: bool, iteration: int) -> onnx.ModelProto:
        """The model a check runs for candidate ``model``: converted to ``low`` (logged once a run) unless
        the candidate runs as typed (``Candidate.as_typed``) or already holds low-precision or Q/DQ tensors.

        Raises:
            ConfigError: ``low`` is int8 and the candidate is fp32 (``lowered``).
            InvalidCandidateError: the conversion failed or made an invalid model (the tool's defect).
        """
        if self.low is not None and not as_typed and not has_low_precision(model) and not has_qdq(model):
            if not self._said_converting and not is_quantized(self.low):
                self._said_converting = True
                log.info(
                    "Candidates hold no %s tensors: each is converted to %s before it runs, as TensorRT's --fp16 "
                    "runs an fp32 model (checker.low_precision; graph input/output types kept)",
                    self.low,
                    self.low,
                )
            model = lowered(model, self.low, f"iteration {iteration}'s candidate")
        if self._to_warn:
            self._to_warn = not warn_fp16_on_cpu(model)
        return model

    def as_run(self, model: onnx.ModelProto) -> Optional[Tuple[onnx.ModelProto, str]]:
        """How a check runs an fp32 ``model`` when that is not as written: ``as_run`` with this run's ``low``.

        Raises:
            InvalidCandidateError: the conversion failed (the tool's defect).
        """
        return as_run(model, self.low, self.emulating)
