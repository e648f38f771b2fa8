"""Does an int8 answer found on CPU hold on a GPU? The detector's QDQ answer and its fp32 original on ONNX
Runtime's CUDA provider, judged by the README's check (IoU of the 0.3-thresholded text maps) against the fp32
maps computed on CPU.

Two steps, since the GPU machine may lack Pillow and this project (``../shared/gpu/README.md`` carries
onnxruntime-gpu there):

    python benchmarks/int8_on_gpu.py prepare DIR ANSWER.onnx   # here: pages, CPU maps, both models into DIR
    python3 benchmarks/int8_on_gpu.py check DIR                 # there: numpy and onnxruntime-gpu only

Writes the per-page IoU (against fp32 on CPU, and against the int8 model on CPU) as JSON on stdout.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union


def prepare(directory: Path, answer: Path) -> None:
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT))
    from examples.text_pages import detector_pages

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DETECTOR, directory / "fp32.onnx")
    shutil.copyfile(answer, directory / "int8.onnx")
    pages = [f["x"] for f in detector_pages()]
    maps = {}
    for name in ("fp32", "int8"):
        session = ort.InferenceSession(str(directory / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        maps[f"{name}_cpu"] = np.concatenate([session.run(None, {"x": p})[0] for p in pages])
    np.savez(directory / "pages.npz", pages=np.concatenate(pages), fp32_cpu=maps["fp32_cpu"], int8_cpu=maps["int8_cpu"])


def check(directory: Path) -> None:
    import onnxruntime as ort

    data = np.load(directory / "pages.npz")
    options = {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": 0}
    out = {"onnxruntime": ort.__version__}
    for name in ("fp32", "int8"):
        session = ort.InferenceSession(
            str(directory / f"{name}.onnx"), providers=[("CUDAExecutionProvider", options), "CPUExecutionProvider"]
        )
        got = np.concatenate([session.run(None, {"x": p[None]})[0] for p in data["pages"]])
        out[name] = {
            "providers": session.get_providers(),
            "iou_vs_fp32_cpu": [round(iou(g > 0.3, r > 0.3), 4) for g, r in zip(got, data["fp32_cpu"])],
            "iou_vs_int8_cpu": [round(iou(g > 0.3, r > 0.3), 4) for g, r in zip(got, data["int8_cpu"])],
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        check(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
