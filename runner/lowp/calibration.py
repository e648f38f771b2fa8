"""int8 activation ranges: ONNX Runtime's calibrator run once over a run's samples (``calibrate``).

``quantize_static`` calibrates every time it is called; here the calibration is its own step, as
``quantize_static`` itself calls it (``onnxruntime/python/tools/quantization/quantize.py``), and
``runner.lowp.quantize`` reuses the ranges for every candidate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

import numpy as np
import onnx

from runner.errors import ArtifactError, ConfigError, ModelError, first_line
from runner.graph.feeds import as_declared, graph_inputs
from runner.graph.load import as_file
from runner.lowp import calibration_cache
from runner.lowp.entropy import entropy_amax, fold
from runner.lowp.quant_options import ENTROPY_BINS, ENTROPY_QUANTIZED_BINS, QuantOptions

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
        seconds: wall time of the calibration run (of reading the cache, when it was read).
        cache: the calibration cache file (``calibration.cache``), or None.
        cached: the ranges were read from it.
    """

    ranges: Any
    method: str
    samples: int
    seconds: float
    cache: Optional[str] = None
    cached: bool = False

    def summary(self) -> Dict[str, Any]:
        """``summary.json``'s ``calibration`` field (``cache`` and ``cached`` with ``calibration.cache``)."""
        return {
            "method": self.method,
            "samples": self.samples,
            "tensors": len(self.ranges.data),
            "seconds": round(self.seconds, 3),
            **({"cache": self.cache, "cached": self.cached} if self.cache else {}),
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


def _cached_ranges(found: Mapping[str, Any], method: str) -> Any:
    """ONNX Runtime's ``TensorsData`` of ranges read from a calibration cache."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    kind = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy}.get(
        method, CalibrationMethod.Percentile
    )
    data = {
        name: TensorData(lowest=np.array(lo, dtype=np.float32), highest=np.array(hi, dtype=np.float32))
        for name, (lo, hi) in found.items()
    }
    return TensorsData(kind, data)


def _entropy_ranges(histograms: Mapping[str, Any]) -> Any:
    """ONNX Runtime's ``TensorsData`` of TensorRT's entropy thresholds (``runner.lowp.entropy``) over the
    symmetric histograms its collector made (``{tensor: (counts, edges, min, max[, threshold])}``): ``[-amax, amax]``
    clipped to the tensor's own range, as ONNX Runtime clips its thresholds."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    data = {}
    for tensor, (hist, edges, low, high, *_) in histograms.items():  # and the threshold, in newer releases
        amax = entropy_amax(*fold(np.asarray(hist), np.asarray(edges)))
        dtype = np.asarray(edges).dtype
        data[tensor] = TensorData(
            lowest=np.array(max(-amax, float(low)), dtype=dtype),
            highest=np.array(min(amax, float(high)), dtype=dtype),
            hist=np.asarray(hist),
            hist_edges=np.asarray(edges),
        )
    return TensorsData(CalibrationMethod.Entropy, data)


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
    start = time.perf_counter()
    made: Optional[Dict[str, Any]] = None
    if options.cache:
        made = calibration_cache.identity(model, used, options)
        found = calibration_cache.load(Path(options.cache), made)
        if found is not None:
            cal = Calibration(
                _cached_ranges(found, options.method),
                options.method,
                len(used),
                time.perf_counter() - start,
                options.cache,
                True,
            )
            log.info(
                "Read the calibration of %d tensors from %s (made from this model, samples and options)",
                len(found),
                options.cache,
            )
            return cal
    types = {i.name: i.type.tensor_type.elem_type for i in graph_inputs(model)}
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy}.get(
        options.method, CalibrationMethod.Percentile
    )
    extra: Dict[str, Any] = {"symmetric": options.symmetric_activations}
    if options.method == "percentile":
        extra["percentile"] = options.percentile
    if options.method == "entropy":  # ONNX Runtime collects a symmetric histogram: twice TensorRT's |x| bins
        extra.update(num_bins=2 * ENTROPY_BINS, num_quantized_bins=ENTROPY_QUANTIZED_BINS)
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
            if options.method == "entropy":  # TensorRT's thresholds, vectorized (ONNX Runtime's loop: minutes)
                ranges = _entropy_ranges(calibrator.collector.histogram_dict)
            else:
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
    cal = Calibration(ranges, options.method, len(used), time.perf_counter() - start, options.cache)
    if made is not None and options.cache:
        try:
            calibration_cache.save(Path(options.cache), made, ranges.data)
        except OSError as e:
            raise ArtifactError(
                f"calibration.cache={options.cache} cannot be written ({e.strerror}); name another"
            ) from None
    log.info(
        "Calibrated %d tensors on %d samples (%s) in %.1f s; every candidate reuses these ranges",
        len(ranges.data),
        cal.samples,
        options.method,
        cal.seconds,
    )
    return cal
