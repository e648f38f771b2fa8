"""Benchmark: peak memory (RSS) of precision and layerwise runs against the model's size.

Builds a Llama-style decoder (``tests/helpers/graphs.py``'s ``rmsnorm_decoder``: 8 blocks of width
1024, 222 MB of fp32 weights, the first RMSNorm overflowing fp16) and runs, each in its own process
under GNU time (peak RSS of that process alone):

- ``mode=repeat until=1``: load, golden values, one check (the floor of any run);
- ``mode=precision marker=bisect direction=forward`` (no ranking) and ``marker=minimal`` (the ranking);
- ``mode=layerwise``.

Issue 34's target: peak RSS at most 4x the model's size for models of 200 MB and more.

Usage: python benchmarks/memory.py [--layers 8] [--dim 1024]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from _common import print_rows, runner_cmd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.planted import rmsnorm_decoder  # noqa: E402

TIME = shutil.which("time") or "/usr/bin/time"


def _peak(args, run_dir: Path, cwd: Path) -> tuple:
    """(peak RSS in MB, exit code) of ``python -m runner ARGS``."""
    rss = run_dir.with_suffix(".rss")
    cmd = [TIME, "-f", "%M", "-o", str(rss), *runner_cmd(*args, f"hydra.run.dir={run_dir}")]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return int(rss.read_text().split()[-1]) / 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=1024)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, _, ids = rmsnorm_decoder(layers=args.layers, dim=args.dim, vocab=2048, seq=16)
        path, inputs = work / "decoder.onnx", work / "ids.npz"
        onnx.save(model, path)
        np.savez(inputs, ids=ids)
        size = path.stat().st_size / 2**20
        check = ["checker=compare", "checker.backend=fp16_emulation", "checker.check_error_stat=rel_l2"]
        check.append("checker.rtol=0.01")
        runs = {
            "repeat until=1 (load, golden, one check)": ["mode=repeat", "until=1", "checker=compare"],
            "precision bisect forward": ["mode=precision", "marker=bisect", "direction=forward", *check],
            "precision minimal (ranking)": ["mode=precision", "marker=minimal", *check],
            "layerwise": ["mode=layerwise", *check],
        }
        for label, extra in runs.items():
            run_dir = work / label.split()[0]
            peak, code = _peak([*extra, f"model={path}", f"inputs={inputs}"], run_dir, work)
            shutil.rmtree(run_dir, ignore_errors=True)
            rows.append(
                {"run": label, "model_mb": round(size), "peak_rss_mb": round(peak), "x_model": round(peak / size, 1)}
                | {"exit": code}
            )
    print_rows("peak RSS against the model's size (target: at most 4x for models of 200 MB and more)", rows)


if __name__ == "__main__":
    main()
