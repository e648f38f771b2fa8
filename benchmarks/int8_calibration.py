"""Benchmark: int8 calibration methods on the detector, their time and the fully quantized text map's IoU.

Usage: python benchmarks/int8_calibration.py

The bundled detector (``examples/ch_PP-OCRv4_det_infer.onnx``) calibrated on the 4 rendered pages of
``examples.text_pages.detector_pages`` with each ``calibration.method``, quantized whole with TensorRT's
placement, and judged as the README's int8 run judges it: the minimum IoU of its thresholded text map with
fp32's over the pages (the check passes at 0.9). Printed per method: calibration seconds, the tensors
calibrated, the minimum IoU, and the seconds of a second calibration read from ``calibration.cache``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from _common import ROOT, print_rows


def main() -> None:
    sys.path.insert(0, str(ROOT))
    import onnx

    from examples.text_pages import _outputs, detector_pages, iou
    from runner.lowp.calibration import calibrate
    from runner.lowp.quant_options import QuantOptions
    from runner.lowp.quantize import make_quantizer, prepare_int8

    path = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"
    pages = list(detector_pages())
    reference = _outputs(str(path), pages)
    model = prepare_int8(onnx.load(str(path)))
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("minmax", "entropy", "percentile"):
            cache = Path(tmp) / f"{method}.json"
            options = QuantOptions(method=method, cache=str(cache))
            cal = calibrate(model, pages, options)
            again = calibrate(model, pages, options)
            quantized = Path(tmp) / f"{method}.onnx"
            onnx.save(make_quantizer(model, cal, options).convert([]), quantized)
            got = _outputs(str(quantized), pages)
            rows.append(
                {
                    "method": method,
                    "seconds": round(cal.seconds, 1),
                    "tensors": len(cal.ranges.data),
                    "min_iou": round(float(min(iou(g > 0.3, r > 0.3) for g, r in zip(got, reference))), 3),
                    "cache_read_s": round(again.seconds, 3),
                }
            )
            print(rows[-1], flush=True)
    print_rows("int8 calibration of the detector on 4 rendered pages (TensorRT's placement, fully quantized)", rows)


if __name__ == "__main__":
    main()
