"""Benchmark: precision at depth, a decoder whose attention logits overflow fp16 in every layer.

Usage: python benchmarks/depth.py [--layers 4 12 24] [--shapes every amplified] [--node-level-up-to 24]
       [--most-must-stay-only]

The decoder is ``examples.planted.attention_decoder`` (a Qwen2-style layer: RMSNorm, q/k/v projections with
biases, rotary embedding, score MatMul, scale Mul, mask Add, Softmax, MLP), its q and k projections scaled so
that the largest raw score is about 1e6 in every layer. Two shapes:

- ``every``: width 128, 8 heads of 16, 8 tokens (the defaults): every layer needs the same fix, its score
  MatMul, scale Mul, mask Add and Softmax in fp32, and nothing else;
- ``amplified``: width 64, 4 heads of 16, 16 tokens: softmaxes so sharp that fp16 rounding anywhere upstream
  flips a near tie from 12 layers on, so the first blocks need fp32 too (the issue's Qwen2 case).

Each run is ``mode=precision marker=minimal checker=compare checker.backend=fp16_emulation
checker.check_error_stat=rel_l2 checker.rtol=0.05``, in a process of its own: the tied search (the default)
and the node-level search (``tie_blocks=false``, the search before it) side by side. Printed per run: shape,
layers, nodes, search, kept, checks (the answer's own check and the gates included), wall seconds, the level
the answer is 1-minimal at, and whether the answer as written passed.

"Most must stay": the detector fed the README's unnormalised pixels at rel L2 1e-3 (fp16 emulation), where 198
of its 330 nodes must stay: the run without a budget (the check at which it said that most may have to stay,
the 1-minimal answer), with ``budget.checks=40``, and that budgeted run resumed without a budget
(``replay.load=``: the checks it adds, the verdicts it reuses, the same answer).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import onnx
from _common import ROOT, print_rows, run_job

SHAPES: Dict[str, Dict[str, Any]] = {"every": {}, "amplified": {"dim": 64, "heads": 4, "seq": 16}}
CHECK = ["checker=compare", "checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2", "checker.rtol=0.05"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 12, 24])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument(
        "--node-level-up-to", type=int, default=24, help="run the node-level search only up to this many layers"
    )
    parser.add_argument("--most-must-stay-only", action="store_true", help="only the detector's most-must-stay rows")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from examples.planted import attention_decoder

    most_must_stay()
    if args.most_must_stay_only:
        return
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for shape in args.shapes:
            for layers in args.layers:
                model, needed, ids = attention_decoder(layers=layers, **SHAPES[shape])
                path, inputs = work / f"{shape}{layers}.onnx", work / f"{shape}{layers}.npz"
                onnx.save(model, path)
                np.savez(inputs, ids=ids)
                searches: List[Tuple[str, List[str]]] = [("tied", [])]
                if layers <= args.node_level_up_to:
                    searches.append(("nodes", ["tie_blocks=false"]))
                for search, extra in searches:
                    run_dir = work / f"{shape}{layers}_{search}"
                    data = [f"model={path}", f"inputs={inputs}", f"output={run_dir}.onnx"]
                    wall, s = run_job(
                        ["mode=precision", "marker=minimal", *data, *CHECK, *extra],
                        run_dir,
                        ROOT,
                        f"{shape} {layers} layers, {search}",
                    )
                    rows.append(
                        {
                            "shape": shape,
                            "layers": layers,
                            "nodes": s["total"],
                            "search": search,
                            "kept": s["kept"],
                            "planted": len(needed),
                            "checks": s["checks"],
                            "wall_s": round(wall, 1),
                            "minimal_at": s.get("blocks", {}).get("minimal_at", "nodes"),
                            "verified": s["answer_verified"]["passed"],
                        }
                    )
                    print(rows[-1], flush=True)
    print_rows("Precision at depth: attention overflowing fp16 in every layer (fp16 emulation, rel L2 0.05)", rows)


def most_must_stay() -> None:
    """The detector at rel L2 1e-3: without a budget, with ``budget.checks=40``, and that run resumed."""
    from _common import MODELS

    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pixels = work / "pixels.npz"
        np.savez(pixels, x=(np.random.default_rng(0).random((1, 3, 96, 96)) * 255).astype(np.float32))
        model = MODELS / "ch_PP-OCRv4_det_infer.onnx"
        tight = [c.replace("checker.rtol=0.05", "checker.rtol=1e-3") for c in CHECK]
        base = ["mode=precision", "marker=minimal", f"model={model}", f"inputs={pixels}", *tight]
        budgeted = work / "budgeted"
        for label, extra, run_dir in (
            ("no budget", [], work / "full"),
            ("budget.checks=40", ["budget.checks=40"], budgeted),
            ("resumed, no budget", [f"replay.load={budgeted / 'replay.json'}"], work / "resumed"),
        ):
            wall, s = run_job([*base, *extra, f"output={run_dir}.onnx"], run_dir, ROOT, f"detector, {label}")
            said = s.get("most_must_stay") or {}
            rows.append(
                {
                    "run": label,
                    "kept": s["kept"],
                    "of": s["total"],
                    "checks": s["checks"],
                    "reused": s.get("reused", 0),
                    "wall_s": round(wall, 1),
                    "minimal": s.get("minimal", True),
                    "said_most_must_stay_at_check": said.get("checks"),
                    "verified": s["answer_verified"]["passed"],
                }
            )
            print(rows[-1], flush=True)
    print_rows("Most must stay: the detector at rel L2 1e-3 (fp16 emulation, CPU)", rows)


if __name__ == "__main__":
    main()
