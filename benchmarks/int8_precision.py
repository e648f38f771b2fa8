"""Benchmark: int8 precision on the bundled OCR models and rendered text (examples/text_pages.py).

For each marker, the nodes kept float, the checks and the wall time of ``mode=precision
low_precision=int8`` on the detector (check: the 0.3-thresholded text map overlaps fp32's by IoU >= 0.9
on each of 4 pages) and the classifier (check: the fp32 labels on 8 lines); then what one candidate
costs to build: an int8 QDQ candidate from the run's calibration against an fp16 one (the project's
converter), and the one calibration pass.

Usage: python benchmarks/int8_precision.py [--part runs|cost|all]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import print_rows, run_job

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.text_pages import detector_pages, iou, text_map_iou  # noqa: E402

DETECTOR = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"
CLASSIFIER = ROOT / "examples" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
RUNS = [("minimal", "forward"), ("bisect", "ranked"), ("bisect", "forward"), ("bisect", "reverse")]


def _min_iou(candidate: Path) -> float:
    """The smallest IoU over the pages of the candidate's thresholded text map with fp32's."""
    import onnxruntime as ort

    ref = ort.InferenceSession(str(DETECTOR), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(candidate), providers=["CPUExecutionProvider"])
    return min(iou(got.run(None, f)[0] > 0.3, ref.run(None, f)[0] > 0.3) for f in detector_pages())


def runs(work: Path) -> None:
    cases = [
        ("detector", DETECTOR, "detector_pages", "text_map_iou", RUNS),
        ("classifier", CLASSIFIER, "classifier_lines", "same_labels", RUNS[:1]),
    ]
    rows = []
    for label, model, loader, check, markers in cases:
        for marker, direction in markers:
            run_dir = work / f"{label}-{marker}-{direction}"
            out = run_dir.with_suffix(".onnx")
            wall, s = run_job(
                [
                    "mode=precision",
                    "low_precision=int8",
                    f"marker={marker}",
                    f"direction={direction}",
                    f"model={model}",
                    f"data_loader=examples.text_pages.{loader}",
                    "checker=python",
                    f"checker.target=examples.text_pages.{check}",
                    f"checker.args=[{model}]",
                    f"output={out}",
                ],
                run_dir,
                ROOT,
                f"{label} {marker} {direction}",
            )
            rows.append(
                {
                    "model": label,
                    "marker": marker,
                    "direction": s["direction"],
                    "kept": s["kept"],
                    "total": s["total"],
                    "kept_nodes": ",".join(n["name"] for n in s["kept_nodes"][:4]) + ("..." if s["kept"] > 4 else ""),
                    "checks": s["checks"],
                    "min_iou": round(_min_iou(out), 3) if label == "detector" else "",
                    "passes_as_written": s["answer_verified"]["check_passed"],
                    "calibration_s": s["calibration"]["seconds"],
                    "wall_s": round(wall, 1),
                }
            )
    print_rows("int8 precision: nodes kept float, checks, wall time (CPU)", rows)


def cost() -> None:
    import onnx

    from runner.lowp.calibration import calibrate
    from runner.lowp.convert import Converter, prepare
    from runner.lowp.precisions import FLOAT16
    from runner.lowp.quant_options import QuantOptions
    from runner.lowp.quantize import Quantizer, prepare_int8

    model = onnx.load(str(DETECTOR))
    fp16 = prepare(model, FLOAT16)
    int8 = prepare_int8(model)
    options = QuantOptions()
    start = time.perf_counter()
    cal = calibrate(int8, list(detector_pages()), options)
    calibration_s = time.perf_counter() - start
    converter = Converter(fp16, FLOAT16)
    half = [n.name for n in int8.graph.node[: len(int8.graph.node) // 2]]

    def median(make, kept) -> float:
        """Median of 3 builds, each by a fresh builder (the quantizer keeps its last candidates)."""
        times = []
        for _ in range(3):
            builder = make()
            start = time.perf_counter()
            builder.convert(kept)
            times.append(time.perf_counter() - start)
        return round(statistics.median(times), 3)

    def quantizer() -> Quantizer:
        return Quantizer(int8, cal, options)

    rows = [
        {"what": "calibration (4 pages, once per run)", "seconds": round(calibration_s, 3)},
        {"what": "int8 QDQ candidate, none kept", "seconds": median(quantizer, [])},
        {"what": "int8 QDQ candidate, half kept", "seconds": median(quantizer, half)},
        {"what": "fp16 candidate, none kept", "seconds": median(lambda: converter, [])},
        {"what": "fp16 candidate, half kept", "seconds": median(lambda: converter, half)},
    ]
    print_rows("cost of one detector candidate (CPU, median of 3)", rows)
    assert text_map_iou(str(DETECTOR), str(DETECTOR))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["runs", "cost", "all"], default="all")
    args = parser.parse_args()
    if args.part in ("cost", "all"):
        cost()
    if args.part in ("runs", "all"):
        with tempfile.TemporaryDirectory() as tmp:
            runs(Path(tmp))


if __name__ == "__main__":
    main()
