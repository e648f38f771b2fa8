"""Benchmark: this tool's mode=reduce against `polygraphy debug reduce`, same model, same check.

Usage: python benchmarks/reduce_vs_polygraphy.py [--markers bisect linear] [--node p2o.Conv.31 ...]
Needs the benchmark extra (pip install ".[benchmark]") for Polygraphy. Prints, per marker and
tool: check runs (counted by the check itself), final compute nodes (non-Constant) and all
nodes, wall time, and the ratios runner / polygraphy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _common import COUNTING_CHECK, MODELS, compute_nodes, polygraphy_exe, print_rows, runner_cmd, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(MODELS / "ch_PP-OCRv4_det_infer.onnx"))
    parser.add_argument("--shapes", default="x:[1,3,160,160]")
    parser.add_argument(
        "--node", nargs="+", default=["p2o.Conv.31"], help="the check fails while all these nodes are present"
    )
    parser.add_argument("--markers", nargs="+", default=["bisect", "linear"])
    args = parser.parse_args()
    polygraphy = polygraphy_exe()
    rows = []
    for marker in args.markers:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            check = work / "check.py"
            check.write_text(COUNTING_CHECK)
            results = {}
            for tool in ("runner", "polygraphy"):
                counter = work / f"{tool}_{marker}.count"
                counter.write_text("")
                out = work / f"{tool}_{marker}.onnx"
                if tool == "runner":
                    name, _, dims = args.shapes.partition(":")
                    cmd = runner_cmd(
                        "mode=reduce",
                        f"marker={marker}",
                        f"model={args.model}",
                        f"model_input_shapes={{{name}:{dims}}}",
                        f'checker.cmd="{sys.executable} {check} {{artifact}} {" ".join(args.node)}"',
                        f"output={out}",
                        f"hydra.run.dir={work / 'run'}",
                    )
                else:
                    cmd = [
                        polygraphy,
                        "debug",
                        "reduce",
                        args.model,
                        "-o",
                        str(out),
                        "--mode",
                        marker,
                        "--model-input-shapes",
                        args.shapes,
                        "--check",
                        sys.executable,
                        str(check),
                        "polygraphy_debug.onnx",
                        *args.node,
                    ]
                wall, proc = timed(cmd, work, {"BENCH_COUNTER": str(counter)})
                if proc.returncode != 0 or not out.exists():
                    sys.exit(f"{tool} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                compute, total = compute_nodes(out)
                results[tool] = {
                    "checks": len(counter.read_text()),
                    "compute_nodes": compute,
                    "nodes": total,
                    "wall_s": round(wall, 1),
                }
            r, p = results["runner"], results["polygraphy"]
            for tool, res in results.items():
                rows.append({"marker": marker, "tool": tool, **res})
            rows.append(
                {
                    "marker": marker,
                    "tool": "ratio runner/polygraphy",
                    "checks": round(r["checks"] / p["checks"], 2),
                    "compute_nodes": round(r["compute_nodes"] / max(p["compute_nodes"], 1), 2),
                    "nodes": round(r["nodes"] / max(p["nodes"], 1), 2),
                    "wall_s": round(r["wall_s"] / p["wall_s"], 2),
                }
            )
    print_rows(f"reduce {Path(args.model).name}, check fails while {args.node} present", rows)


if __name__ == "__main__":
    main()
