"""Benchmark: the detector quantized to int8 with this tool's TensorRT placement, beside NVIDIA ModelOpt's.

For each: Q/DQ nodes, the compute nodes that read a DequantizeLinear (quantized), and the text map's
IoU with the fp32 model's on each of the 4 rendered pages (``examples/text_pages.py``; the README's
check passes at IoU >= 0.9). Both calibrate on the same 4 pages (max/minmax calibration).

ModelOpt (``pip install "nvidia-modelopt[onnx]"``, with torch) is run by the Python that has it
(``--modelopt-python``, e.g. a separate virtual environment); without one, only this tool's row.

Usage: python benchmarks/int8_vs_modelopt.py [--modelopt-python PATH]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from _common import MODELS, print_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.text_pages import detector_pages  # noqa: E402
from runner.graph.qdq import quantized_nodes  # noqa: E402
from runner.lowp.calibration import calibrate  # noqa: E402
from runner.lowp.quant_options import QuantOptions  # noqa: E402
from runner.lowp.quantize import make_quantizer, prepare_int8  # noqa: E402

MODELOPT = """
import sys, numpy as np
from modelopt.onnx.quantization import quantize
quantize(onnx_path=sys.argv[1], quantize_mode="int8", calibration_data=np.load(sys.argv[2]),
         calibration_method="max", output_path=sys.argv[3], high_precision_dtype="fp32", calibration_eps=["cpu"])
"""


def _row(label: str, model: onnx.ModelProto, pages, reference, seconds: float) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ious = []
    for feeds, ref in zip(pages, reference):
        got = session.run(None, feeds)[0] > 0.3
        want = ref > 0.3
        ious.append(float((got & want).sum() / max((got | want).sum(), 1)))
    ops = [n.op_type for n in model.graph.node]
    return {
        "placement": label,
        "Q": ops.count("QuantizeLinear"),
        "DQ": ops.count("DequantizeLinear"),
        "quantized_nodes": len(quantized_nodes(model)),
        "min_iou": round(min(ious), 3),
        "passes": min(ious) >= 0.9,
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modelopt-python", help="a Python with nvidia-modelopt[onnx] installed")
    args = parser.parse_args()
    path = MODELS / "ch_PP-OCRv4_det_infer.onnx"
    pages = list(detector_pages())
    fp32 = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = [fp32.run(None, feeds)[0] for feeds in pages]
    rows = []
    start = time.perf_counter()
    model = prepare_int8(onnx.load(str(path)))
    for placement in ("tensorrt", "onnxruntime"):
        options = QuantOptions(placement=placement)
        quantized = make_quantizer(model, calibrate(model, pages, options), options).convert([])
        rows.append(_row(f"this tool ({placement})", quantized, pages, reference, time.perf_counter() - start))
        start = time.perf_counter()
    if args.modelopt_python:
        with tempfile.TemporaryDirectory() as tmp:
            data, out = Path(tmp) / "calib.npy", Path(tmp) / "det_modelopt.onnx"
            copy = Path(tmp) / path.name  # ModelOpt rewrites its input in place (value_info added): a copy
            shutil.copyfile(path, copy)
            np.save(data, np.concatenate([p["x"] for p in pages]))
            start = time.perf_counter()
            done = subprocess.run(
                [args.modelopt_python, "-c", MODELOPT, str(copy), str(data), str(out)], capture_output=True, text=True
            )
            if done.returncode:
                sys.exit(f"ModelOpt failed:\n{done.stderr[-2000:]}")
            rows.append(
                _row("NVIDIA ModelOpt (int8)", onnx.load(str(out)), pages, reference, time.perf_counter() - start)
            )
    print_rows("the detector fully quantized to int8: Q/DQ placement and the text map's IoU (>= 0.9 passes)", rows)


if __name__ == "__main__":
    main()
