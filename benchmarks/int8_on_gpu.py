"""Does an int8 or fp8 answer found on CPU hold on a GPU? The detector's QDQ answers and its fp32 original on
ONNX Runtime's CUDA provider, judged by the README's check (IoU of the 0.3-thresholded text maps) against the
fp32 maps computed on CPU.

Two steps, since the GPU machine may lack Pillow and this project (``../shared/gpu/README.md`` carries
onnxruntime-gpu there):

    python benchmarks/int8_on_gpu.py prepare DIR ANSWER.onnx [NAME=MORE.onnx ...]  # here: pages, CPU maps, models
    python3 benchmarks/int8_on_gpu.py check DIR                 # there: numpy and onnxruntime-gpu only

The first answer is named ``int8``, others as given (``fp8=det_fp8.onnx``). Writes, per model, the providers
its session kept and the per-page IoU against fp32 on CPU and against itself on CPU, as JSON on stdout.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Dict

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union


def prepare(directory: Path, answers: Dict[str, Path]) -> None:
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT))
    from examples.text_pages import detector_pages

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DETECTOR, directory / "fp32.onnx")
    for name, answer in answers.items():
        shutil.copyfile(answer, directory / f"{name}.onnx")
    pages = [f["x"] for f in detector_pages()]
    maps = {}
    for name in ("fp32", *answers):
        session = ort.InferenceSession(str(directory / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        maps[f"{name}_cpu"] = np.concatenate([session.run(None, {"x": p})[0] for p in pages])
    (directory / "models.json").write_text(json.dumps(["fp32", *answers]))
    savez: Any = np.savez  # numpy's stub types **arrays as its keyword options
    savez(directory / "pages.npz", pages=np.concatenate(pages), **maps)


def check(directory: Path) -> None:
    import onnxruntime as ort

    data = np.load(directory / "pages.npz")
    options = {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": 0}
    out = {"onnxruntime": ort.__version__}
    listed = directory / "models.json"
    for name in json.loads(listed.read_text()) if listed.exists() else ["fp32", "int8"]:
        session = ort.InferenceSession(
            str(directory / f"{name}.onnx"), providers=[("CUDAExecutionProvider", options), "CPUExecutionProvider"]
        )
        got = np.concatenate([session.run(None, {"x": p[None]})[0] for p in data["pages"]])
        out[name] = {
            "providers": session.get_providers(),
            "iou_vs_fp32_cpu": [round(iou(g > 0.3, r > 0.3), 4) for g, r in zip(got, data["fp32_cpu"])],
            "iou_vs_itself_cpu": [round(iou(g > 0.3, r > 0.3), 4) for g, r in zip(got, data[f"{name}_cpu"])],
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "prepare":
        named = {"int8": Path(sys.argv[3])}
        named.update({a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in sys.argv[4:]})
        prepare(Path(sys.argv[2]), named)
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        check(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
