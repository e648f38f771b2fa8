"""Benchmark: precision at depth, a decoder whose attention logits overflow fp16 in every layer.

Usage: python benchmarks/depth.py [--layers 4 12 24] [--shapes every amplified] [--node-level-up-to 24]

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
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from examples.planted import attention_decoder

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


if __name__ == "__main__":
    main()
