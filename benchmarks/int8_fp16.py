"""int8 with the rest in fp16 (TensorRT's ``--int8 --fp16``) on the detector: the answer's int8, fp16 and fp32
nodes, and the answer run as written on every provider this machine has.

Two runs of ``mode=precision low_precision=int8 quantization.float_precision=float16 marker=minimal``,
calibrated and judged on the four rendered pages: the README's text-map check (IoU >= 0.9,
``checker=python``), and ``checker=compare`` under fp16 emulation with a rel L2 bound on the text map
(its answer verified on ``checker.verify_on``'s default arithmetics, the CUDA provider where it runs).
Each written answer is then run on the CPU provider and, where onnxruntime-gpu runs, the CUDA provider
(real fp16 kernels), against the fp32 model's CPU text map.

    python benchmarks/int8_fp16.py [OUT_DIR] [--rtol 0.08]

Pages: rendered with Pillow (``examples/text_pages.py``), or read from ``$BENCH_PAGES`` as
``benchmarks/int8_margin.py`` reads them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = ROOT / "examples" / "ch_PP-OCRv4_det_infer.onnx"
PAGES = ROOT / "benchmarks" / "int8_margin.py"


def _on_providers(answer: Path) -> Dict[str, str]:
    """The answer's worst IoU and rel L2 against the fp32 model's CPU text map, per provider that runs here."""
    import onnxruntime as ort
    from int8_margin import pages  # the benchmarks folder is on sys.path when run as a script

    feeds = list(pages())
    reference = ort.InferenceSession(str(DETECTOR), providers=["CPUExecutionProvider"])
    golden = [reference.run(None, f)[0] for f in feeds]
    found: Dict[str, str] = {}
    for provider in ("CPUExecutionProvider", "CUDAExecutionProvider"):
        if provider not in ort.get_available_providers():
            continue
        session = ort.InferenceSession(str(answer), providers=[provider])
        if session.get_providers()[0] != provider:
            continue
        got = [session.run(None, f)[0] for f in feeds]
        ious = [
            float(np.logical_and(g > 0.3, r > 0.3).sum() / max(1, np.logical_or(g > 0.3, r > 0.3).sum()))
            for g, r in zip(got, golden)
        ]
        l2 = [float(np.linalg.norm(g - r) / np.linalg.norm(r)) for g, r in zip(got, golden)]
        found[provider.replace("ExecutionProvider", "")] = f"IoU >= {min(ious):.3f}, rel L2 <= {max(l2):.4f}"
    return found


def main() -> None:
    from _common import print_rows, run_job

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=None)
    parser.add_argument("--rtol", default="0.08")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="int8_fp16_"))
    out.mkdir(parents=True, exist_ok=True)
    common = [
        "mode=precision",
        "low_precision=int8",
        "quantization.float_precision=float16",
        "marker=minimal",
        f"model={DETECTOR}",
        f"data_loader={PAGES}:pages",
    ]
    checks = {
        "text map IoU >= 0.9": [
            "checker=python",
            "checker.target=examples.text_pages.text_map_iou",
            f"checker.args=[{DETECTOR}]",
        ],
        f"rel L2 <= {args.rtol}": [
            "checker=compare",
            "checker.backend=fp16_emulation",
            "checker.check_error_stat=rel_l2",
            f"checker.rtol={args.rtol}",
        ],
    }
    rows: List[Dict] = []
    for k, (check, argv) in enumerate(checks.items()):
        answer = out / f"answer{k}.onnx"
        wall, summary = run_job([*common, *argv, f"output={answer}"], out / f"run{k}", ROOT, check)
        verified = (summary.get("answer_verified") or {}).get("verified_on", {})
        rows.append(
            {
                "check": check,
                "out of int8": summary["kept"],
                "fp32": ", ".join(n["name"] for n in summary["fp32_nodes"]) or "none",
                "checks": summary["checks"],
                "wall_s": round(wall, 1),
                "verified_on": ", ".join(f"{k} {max(v['statistic'].values()):.4f}" for k, v in verified.items()) or "-",
                **_on_providers(answer),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print_rows("int8 with the rest in fp16 on the detector (146 placed nodes, 330 float nodes)", rows)


if __name__ == "__main__":
    main()
