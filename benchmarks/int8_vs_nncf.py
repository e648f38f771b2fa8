"""Benchmark: int8 with an accuracy bound, this tool's precision search beside NNCF's accuracy control, and this
tool's search over NNCF's own placement (``nncf.quantize``'s model as ``quantized_model=``).

The detector, the 4 rendered pages (``examples/text_pages.py``) for calibration and for validation, one
metric for both: the minimum over the pages of the text map's IoU (thresholded at 0.3) against the fp32
model's. This tool: ``mode=precision low_precision=int8 marker=minimal`` with ``checker=python``
``examples.text_pages.text_map_iou`` at the bound. NNCF: ``nncf.quantize_with_accuracy_control`` (ONNX
backend, ``max_drop`` = 1 - bound, absolute, its default settings otherwise), on a copy of the model with
its opset raised to 13 (NNCF's ONNX backend needs it), run by the Python that has NNCF (``--nncf-python``,
its own virtual environment: ``python -m venv V && V/bin/pip install nncf onnx onnxruntime``).

On NNCF's own placement: ``nncf.quantize`` (its defaults, the same 4 pages, the same opset-13 copy) writes the
fully quantized model, and this tool's ``quantized_model=`` run takes the fewest nodes out of it at the bound; the
row's wall holds both.

Each answer is re-evaluated here, in a fresh ONNX Runtime CPU session (default optimizations): kept out of
int8 (this tool: ``kept_nodes``; NNCF: the operations its report says it reverted), evaluations (checks;
NNCF's calls of the metric), wall seconds, peak RSS of the process, the minimum IoU.

Usage: python benchmarks/int8_vs_nncf.py [--nncf-python PATH] [--bounds 0.9,0.97] [--exchange-checks 0,16] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import onnxruntime as ort
from _common import print_rows

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"
sys.path.insert(0, str(ROOT))

from examples.text_pages import detector_pages, iou  # noqa: E402

#: both NNCF scripts' start: the model at opset 13 or newer (NNCF's minimum) and the pages, timed from here
LOAD = """start = time.perf_counter()
model = onnx.load(src)
opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
if opset < 13:
    model = version_converter.convert_version(model, 13)
pages = [np.load(pages_npz)[f"arr_{i}"] for i in range(len(np.load(pages_npz).files))]
"""
#: run by NNCF's Python: argv = model copy, pages .npz, fp32 maps .npz, bound, output path; prints JSON
NNCF = (
    r"""
import json, resource, sys, time
import numpy as np, onnx, onnxruntime as ort, nncf
from onnx import version_converter

src, pages_npz, maps_npz, bound, out = sys.argv[1:6]
"""
    + LOAD
    + r"""maps = [np.load(maps_npz)[f"arr_{i}"] > 0.3 for i in range(len(pages))]
calls = [0]

def validate(candidate, data):
    calls[0] += 1
    session = ort.InferenceSession(candidate.SerializeToString(), providers=["CPUExecutionProvider"])
    ious = []
    for x, ref in zip(data, maps):
        got = session.run(None, {"x": x})[0] > 0.3
        union = np.count_nonzero(got | ref)
        ious.append(1.0 if union == 0 else np.count_nonzero(got & ref) / union)
    return float(min(ious))

quantized = nncf.quantize_with_accuracy_control(
    model, nncf.Dataset(pages, lambda x: {"x": x}), nncf.Dataset(pages), validation_fn=validate,
    max_drop=1 - float(bound), drop_type=nncf.DropType.ABSOLUTE, subset_size=len(pages),
)
onnx.save(quantized, out)
print(json.dumps({"metric_calls": calls[0], "seconds": time.perf_counter() - start,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
)
#: run by NNCF's Python: argv = model copy, pages .npz, output path; prints JSON (``nncf.quantize``, no bound)
NNCF_QUANTIZE = (
    r"""
import json, sys, time
import numpy as np, onnx, nncf
from onnx import version_converter

src, pages_npz, out = sys.argv[1:4]
"""
    + LOAD
    + r"""quantized = nncf.quantize(model, nncf.Dataset(pages, lambda x: {"x": x}), subset_size=len(pages))
onnx.save(quantized, out)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""
)
#: this tool's run, wrapped to report the process's peak RSS: argv = the runner's arguments
OURS = r"""
import resource, runpy, sys
sys.argv = ["runner", *sys.argv[1:]]
try:
    runpy.run_module("runner", run_name="__main__")
finally:
    print("PEAK_RSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)
"""


def min_iou(path: Path, pages: List[Dict[str, np.ndarray]], maps: List[np.ndarray]) -> float:
    """The model file's text map against the fp32 maps: the smallest IoU over the pages."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return min(iou(session.run(None, p)[0] > 0.3, m > 0.3) for p, m in zip(pages, maps))


def ours(bound: str, model: Path, work: Path, pages, maps, exchange: int, given: Path | None = None) -> Dict:
    label = f"ours_{bound}_x{exchange}" + ("_nncf" if given else "")
    out, run_dir = work / f"{label}.onnx", work / label
    precision = [f"quantized_model={given}"] if given else ["low_precision=int8"]
    args = [
        "mode=precision",
        *precision,
        "marker=minimal",
        f"model={model}",
        "data_loader=examples.text_pages.detector_pages",
        "checker=python",
        "checker.target=examples.text_pages.text_map_iou",
        f"checker.args=[{model},0.3,{bound}]",
        f"output={out}",
        f"exchange_checks={exchange}",
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", OURS, *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"this tool at {bound} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    peak = float(re.findall(r"PEAK_RSS_MB (\S+)", done.stderr)[-1])
    return {
        "tool": f"this project, exchange_checks={exchange}" + (", on nncf.quantize's model" if given else ""),
        "bound": float(bound),
        "kept": len(summary["kept_nodes"]),
        "kept_nodes": " ".join(n["name"] for n in summary["kept_nodes"]),
        "evaluations": summary["checks"],
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(peak),
        "min_iou": round(min_iou(out, pages, maps), 4),
    }


def nncf_then_ours(
    python: str, bound: str, model: Path, work: Path, pages_npz: Path, pages, maps, exchange: int
) -> Dict:
    """``nncf.quantize`` on a copy of the model, then this tool's search over that model (``quantized_model=``)."""
    copy, given = work / f"nncf_quantize_input_{bound}.onnx", work / f"nncf_quantize_{bound}.onnx"
    shutil.copyfile(model, copy)  # a third-party tool may rewrite its input
    done = subprocess.run(
        [python, "-c", NNCF_QUANTIZE, str(copy), str(pages_npz), str(given)], capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"nncf.quantize failed:\n{done.stderr[-3000:]}")
    seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    row = ours(bound, model, work, pages, maps, exchange, given)
    row["wall_s"] = round(row["wall_s"] + seconds, 1)
    row["fully_quantized_iou"] = round(min_iou(given, pages, maps), 4)
    return row


def nncf(python: str, bound: str, model: Path, work: Path, pages_npz: Path, maps_npz: Path, pages, maps) -> Dict:
    out = work / f"nncf_{bound}.onnx"
    copy = work / f"nncf_input_{bound}.onnx"  # a copy per run: a third-party tool may rewrite its input
    shutil.copyfile(model, copy)
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-c", NNCF, str(copy), str(pages_npz), str(maps_npz), bound, str(out)], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"NNCF at {bound} failed:\n{done.stderr[-3000:]}")
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    log = done.stdout + done.stderr
    reverted = re.search(r"(\d+) out of (\d+)\s+were reverted", log)
    names = re.findall(r"^\s*(?:INFO:nncf:)?\s*\|?\s*(p2o\.\S+)", log[reverted.end() :] if reverted else "", re.M)
    return {
        "tool": "NNCF "
        + subprocess.run(
            [python, "-c", "import nncf; print(nncf.__version__)"], capture_output=True, text=True
        ).stdout.strip(),
        "bound": float(bound),
        "kept": int(reverted.group(1)) if reverted else 0,
        "kept_nodes": " ".join(names),
        "evaluations": facts["metric_calls"],
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(facts["peak_rss_mb"]),
        "min_iou": round(min_iou(out, pages, maps), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nncf-python", help="a Python with nncf, onnx and onnxruntime installed")
    parser.add_argument("--bounds", default="0.9,0.97")
    parser.add_argument("--exchange-checks", default="0,16", help="this tool's runs, one per budget")
    parser.add_argument("--out", type=Path, help="keep the answers here (default: a temporary directory)")
    args = parser.parse_args()
    pages = list(detector_pages())
    fp32 = ort.InferenceSession(str(DETECTOR), providers=["CPUExecutionProvider"])
    maps = [fp32.run(None, p)[0] for p in pages]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = work / DETECTOR.name  # a copy: nothing here touches the bundled file or ../shared/models
        shutil.copyfile(DETECTOR, model)
        pages_npz, maps_npz = work / "pages.npz", work / "maps.npz"
        np.savez(pages_npz, *[p["x"] for p in pages])
        np.savez(maps_npz, *maps)
        for bound in args.bounds.split(","):
            for exchange in args.exchange_checks.split(","):
                rows.append(ours(bound, model, work, pages, maps, int(exchange)))
                print(json.dumps(rows[-1]), flush=True)
            if args.nncf_python:
                rows.append(nncf(args.nncf_python, bound, model, work, pages_npz, maps_npz, pages, maps))
                print(json.dumps(rows[-1]), flush=True)
                exchange = int(args.exchange_checks.split(",")[-1])
                rows.append(nncf_then_ours(args.nncf_python, bound, model, work, pages_npz, pages, maps, exchange))
                print(json.dumps(rows[-1]), flush=True)
    print_rows("int8 under a minimum text-map IoU: nodes kept out of int8, evaluations, wall, re-evaluated IoU", rows)


if __name__ == "__main__":
    main()
