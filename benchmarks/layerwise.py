"""Benchmark: ``mode=layerwise`` wall time and peak memory, and what ``polygraphy run --onnx-outputs mark all``
shows for the same question.

Cases: the real detector fed 0-255 pixels under fp16 emulation (target: under 10 s on CI's 2 cores), a
5000-node chain (target: under 60 s), and a 200-node chain of 1 MB tensors without a memory budget and
with ``layerwise.max_memory_mb=64`` (peak memory bounded: values compared in chunks of nodes). Times are
whole ``python -m runner`` processes, start-up included; peak RSS through GNU time where it exists.

Usage: python benchmarks/layerwise.py [--chain 5000] [--size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import onnx
from _common import MODELS, print_rows, runner_cmd
from graphs import chain

TIME = shutil.which("time") or "/usr/bin/time"


def _run(args: List[str], work: Path, run_dir: Path) -> Dict:
    """Run the runner; wall seconds, peak RSS (MB) and the summary."""
    rss = work / "rss.txt"
    cmd = runner_cmd(*args, f"hydra.run.dir={run_dir}")
    if Path(TIME).is_file():
        cmd = [TIME, "-f", "%M", "-o", str(rss), *cmd]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=os.environ.copy())
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{args[:3]} failed:\n{proc.stderr[-2000:]}")
    peak = int(rss.read_text().split()[-1]) // 1024 if rss.is_file() else None
    return {
        "wall_s": round(wall, 1),
        "peak_rss_mb": peak,
        "summary": json.loads((run_dir / "summary.json").read_text()),
    }


def _row(case: str, run: Dict, target_s: int) -> Dict:
    """One table row from a run of ``_run``."""
    s = run["summary"]
    return {
        "case": case,
        "nodes": s["nodes"],
        "wall_s": run["wall_s"],
        "target_s": target_s,
        "peak_rss_mb": run["peak_rss_mb"],
        "first_divergence": s["first_divergence"]["node"] if s["first_divergence"] else None,
        "top_introduced": s["top_introduced"][0]["node"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chain", type=int, default=5000, help="nodes of the chain")
    parser.add_argument("--size", type=int, default=64, help="detector input height and width")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fp16 = ["checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2", "checker.rtol=0.05"]
        detector = MODELS / "ch_PP-OCRv4_det_infer.onnx"
        r = _run(
            [
                "mode=layerwise",
                f"model={detector}",
                "val_range=[0,255]",
                f"model_input_shapes={{x:[1,3,{args.size},{args.size}]}}",
                *fp16,
            ],
            work,
            work / "detector",
        )
        rows.append(_row(f"detector 0-255 {args.size}x{args.size}", r, 10))
        path = work / "chain.onnx"
        onnx.save(chain(args.chain, args.chain // 2), path)
        wide = work / "wide.onnx"
        onnx.save(chain(200, 100, width=2**18), wide)
        cases = [
            (f"chain {args.chain}", path, []),
            ("chain 200 x 1 MB, no budget", wide, ["layerwise.max_memory_mb=null"]),
            ("chain 200 x 1 MB, max_memory_mb=64", wide, ["layerwise.max_memory_mb=64"]),
        ]
        for number, (label, model, budget) in enumerate(cases):
            r = _run(["mode=layerwise", f"model={model}", *fp16, *budget], work, work / f"chain_{number}")
            rows.append(_row(label, r, 60))
    print_rows("mode=layerwise: wall time (whole process) and peak memory", rows)


if __name__ == "__main__":
    main()
