"""Benchmark: kept-node count and checks for each precision marker, on the real detector fed
unnormalised pixels (0-255) judged two ways, a transformer-style graph fed values past fp16's range
(tens of nodes overflow), and the planted-overflow graphs of the tests.

Targets (issue 11): ``marker=minimal`` at most 3k + 2 ceil(log2 n) checks for k kept nodes of n;
``marker=bisect direction=ranked`` at most 2 ceil(log2 n). The ``target`` column shows the bound.

Usage: python benchmarks/precision_markers.py [--size 96] [--layers 8]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from _common import MODELS, print_rows, run_job

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphs import transformer  # noqa: E402

from examples.planted import GRAPHS  # noqa: E402  (the planted-overflow graphs)

RUNS = [
    ("bisect", "forward"),
    ("bisect", "reverse"),
    ("linear", "forward"),
    ("linear", "reverse"),
    ("bisect", "ranked"),
    ("linear", "ranked"),
    ("minimal", "forward"),
]


def _target(marker: str, direction: str, kept: int, total: int) -> str:
    log_n = math.ceil(math.log2(max(total, 2)))
    if marker == "minimal":
        return f"<= {3 * kept + 2 * log_n}"
    if marker == "bisect" and direction == "ranked":
        return f"<= {2 * log_n}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--layers", type=int, default=8, help="blocks of the transformer-style graph")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cases = []
        pixels = work / "pixels.npz"
        np.savez(pixels, x=(np.random.default_rng(0).random((1, 3, args.size, args.size)) * 255).astype(np.float32))
        detector = MODELS / "ch_PP-OCRv4_det_infer.onnx"
        cases.append(
            (
                "detector 0-255 atol",
                detector,
                pixels,
                ["checker.atol=0.05", "checker.rtol=0", "checker.max_mismatch_fraction=0.01"],
            )
        )
        cases.append(
            ("detector 0-255 rel_l2", detector, pixels, ["checker.check_error_stat=rel_l2", "checker.rtol=0.05"])
        )
        tf = work / "transformer.onnx"
        onnx.save(transformer(args.layers, -1), tf)
        tf_inputs = work / "transformer.npz"
        np.savez(tf_inputs, x=(np.random.default_rng(0).standard_normal((1, 16, 64)) * 30000).astype(np.float32))
        cases.append((f"transformer {args.layers} blocks x3e4", tf, tf_inputs, ["checker.atol=0.05", "checker.rtol=0"]))
        for name, make in GRAPHS.items():
            model, _, scale = make()
            path = work / f"{name}.onnx"
            onnx.save(model, path)
            inputs = work / f"{name}.npz"
            np.savez(inputs, x=(scale * (1 + np.random.default_rng(0).random((1, 8)))).astype(np.float32))
            cases.append((name, path, inputs, ["checker.atol=1e-3", "checker.rtol=1e-2"]))
        for label, model, inputs, tol in cases:
            for marker, direction in RUNS:
                run_dir = work / f"{label}-{marker}-{direction}".replace(" ", "_")
                wall, s = run_job(
                    [
                        "mode=precision",
                        f"marker={marker}",
                        f"direction={direction}",
                        f"model={model}",
                        f"inputs={inputs}",
                        "checker=compare",
                        "checker.backend=fp16_emulation",
                        *tol,
                        f"output={run_dir}.onnx",
                    ],
                    run_dir,
                    work,
                    f"{label} {marker}",
                )
                rows.append(
                    {
                        "model": label,
                        "marker": marker,
                        "direction": direction if marker != "minimal" else "ranked",
                        "kept": s["kept"],
                        "total": s["total"],
                        "checks": s["checks"],
                        "target": _target(marker, direction, s["kept"], s["total"]),
                        "wall_s": round(wall, 1),
                    }
                )
    print_rows("precision markers: nodes kept in float32 and checks", rows)


if __name__ == "__main__":
    main()
