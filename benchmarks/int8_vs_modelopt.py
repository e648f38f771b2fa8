"""Benchmark: the detector quantized to int8 with this tool's TensorRT placement, beside NVIDIA ModelOpt's.

For each: Q/DQ nodes, the compute nodes that read a DequantizeLinear (quantized), and the text map's
IoU with the fp32 model's on each of the 4 rendered pages (``examples/text_pages.py``; the README's
check passes at IoU >= 0.9). Both calibrate on the same 4 pages (max/minmax calibration).

ModelOpt (``pip install "nvidia-modelopt[onnx]"``, with torch) is run by the Python that has it
(``--modelopt-python``, e.g. a separate virtual environment); without one, only this tool's row.

With ``--bound B`` (a minimum text-map IoU, e.g. 0.97), also the precision search at that bound: this tool's own
(``low_precision=int8``, TensorRT's placement) beside its search over ModelOpt's models (``quantized_model=``):
ModelOpt's int8 of the detector as exported (its weights are Constant nodes, which ModelOpt quantizes with one
scale per tensor) and of the detector with those weights as initializers (per-channel scales), and ModelOpt's fp8.

Usage: python benchmarks/int8_vs_modelopt.py [--modelopt-python PATH] [--bound 0.97]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
import onnxruntime as ort
from _common import MODELS, print_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.text_pages import detector_pages  # noqa: E402
from runner.graph.constants import constants_to_initializers  # noqa: E402
from runner.graph.qdq import quantized_nodes  # noqa: E402
from runner.lowp.calibration import calibrate  # noqa: E402
from runner.lowp.quant_options import QuantOptions  # noqa: E402
from runner.lowp.quantize import make_quantizer, prepare_int8  # noqa: E402

MODELOPT = """
import sys, numpy as np
from modelopt.onnx.quantization import quantize
mode = sys.argv[4] if len(sys.argv) > 4 else "int8"
quantize(onnx_path=sys.argv[1], quantize_mode=mode, calibration_data=np.load(sys.argv[2]),
         calibration_method="max", output_path=sys.argv[3], high_precision_dtype="fp32", calibration_eps=["cpu"])
"""
#: this tool's precision search at a bound: argv = the runner's arguments; prints the summary's path
SEARCH = ["mode=precision", "marker=minimal", "data_loader=examples.text_pages.detector_pages", "checker=python",
          "checker.target=examples.text_pages.text_map_iou"]  # fmt: skip


def search(label: str, path: Path, given: Optional[Path], bound: float, work: Path, precision: str = "int8") -> dict:
    """This tool's search at ``bound``: over ``given`` (``quantized_model=``) or its own ``precision``."""
    run_dir = work / "".join(c if c.isalnum() else "_" for c in label)
    which = [f"quantized_model={given}"] if given else [f"low_precision={precision}"]
    args = [*SEARCH, f"model={path}", *which, f"checker.args=[{path},0.3,{bound}]", f"output={run_dir}.onnx",
            f"hydra.run.dir={run_dir}"]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runner", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{label} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"search at the bound": label, "bound": bound, "kept": summary["kept"], "of": summary["total"],
            "checks": summary["checks"], "wall_s": round(wall, 1)}  # fmt: skip


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
    parser.add_argument("--bound", type=float, help="also search at this minimum text-map IoU (e.g. 0.97)")
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
    searches = []
    if args.bound:
        with tempfile.TemporaryDirectory() as tmp:
            searches.append(search("this project (int8)", path, None, args.bound, Path(tmp)))
            searches.append(search("this project (fp8)", path, None, args.bound, Path(tmp), "float8"))
    if args.modelopt_python:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "calib.npy"
            np.save(data, np.concatenate([p["x"] for p in pages]))
            initialized = Path(tmp) / "det_initializers.onnx"  # its Constant weights as initializers
            onnx.save(constants_to_initializers(onnx.load(str(path))), initialized)
            made = [
                ("int8", path, "NVIDIA ModelOpt (int8)"),
                ("int8", initialized, "NVIDIA ModelOpt (int8, weights as initializers)"),
                ("fp8", path, "NVIDIA ModelOpt (fp8)"),
            ]
            for mode, source, label in made:
                out = Path(tmp) / f"modelopt_{mode}_{source.stem}.onnx"
                copy = Path(tmp) / f"input_{mode}_{source.stem}.onnx"  # ModelOpt rewrites its input in place: a copy
                shutil.copyfile(source, copy)
                start = time.perf_counter()
                command = [args.modelopt_python, "-c", MODELOPT, str(copy), str(data), str(out), mode]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"ModelOpt failed:\n{done.stderr[-2000:]}")
                rows.append(_row(label, onnx.load(str(out)), pages, reference, time.perf_counter() - start))
                if args.bound:
                    searches.append(search(f"this project on {label}", path, out, args.bound, Path(tmp)))
    print_rows("the detector fully quantized to int8: Q/DQ placement and the text map's IoU (>= 0.9 passes)", rows)
    if searches:
        print_rows(f"the fewest nodes out of int8/fp8 at IoU >= {args.bound}", searches)


if __name__ == "__main__":
    main()
