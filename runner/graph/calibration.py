"""int8 activation ranges: ONNX Runtime's calibrator run once over a run's samples (``calibrate``).

``quantize_static`` calibrates every time it is called; here the calibration is its own step, as
``quantize_static`` itself calls it (``onnxruntime/python/tools/quantization/quantize.py``), and
``runner.graph.quantize`` reuses the ranges for every candidate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.errors import ArtifactError, ConfigError, ModelError, first_line
from runner.graph.feeds import as_declared, graph_inputs
from runner.graph.load import as_file
from runner.graph.quant_options import ENTROPY_BINS, ENTROPY_QUANTIZED_BINS, QuantOptions

log = logging.getLogger(__name__)


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
