"""Benchmark: mode=reduce against `polygraphy debug reduce`, both with Polygraphy's own check from its debug README.

Usage: python benchmarks/reduce_vs_polygraphy_check.py [--cases classifier detector] [--markers bisect]
    [--scale 1.5]

Cases: the bundled classifier with `Conv@33`'s weight scaled (input x:[1,3,48,192]) and the bundled detector with
`p2o.Conv.31`'s (x:[1,3,160,160]). Per case, the good model's inputs and every tensor's value are saved with
`polygraphy run --onnx-outputs mark all`, merged (`polygraphy data merge`), and the Conv's weight of a copy is
scaled (the bad model). Both tools reduce the bad model with the check `polygraphy run {artifact} --onnxrt
--load-inputs all_inputs.json --load-outputs golden.json` (Polygraphy's default tolerance, 1e-5). Prints per case,
marker and tool: checks (this tool's from its summary, Polygraphy's from its log), the final compute nodes, the
wall time, the seconds a check, and the ratios. Needs the benchmark extra (Polygraphy).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import onnx
from _common import MODELS, compute_nodes, polygraphy_exe, print_rows, runner_cmd, timed
from onnx import numpy_helper


def scaled(model: onnx.ModelProto, conv: str, factor: float) -> onnx.ModelProto:
    """A copy of ``model`` with node ``conv``'s weight (an initializer or a Constant's value) times ``factor``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weight = next(n for n in copy.graph.node if n.name == conv).input[1]
    tensors = [i for i in copy.graph.initializer if i.name == weight] + [
        a.t for n in copy.graph.node if n.op_type == "Constant" and n.output[0] == weight for a in n.attribute
    ]
    values = numpy_helper.to_array(tensors[0]) * np.float32(factor)
    tensors[0].CopyFrom(numpy_helper.from_array(values, tensors[0].name))
    return copy


#: case -> (model file in MODELS, input shapes, the Conv whose weight is scaled)
CASES = {
    "classifier": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", "x:[1,3,48,192]", "Conv@33"),
    "detector": ("ch_PP-OCRv4_det_infer.onnx", "x:[1,3,160,160]", "p2o.Conv.31"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--scale", type=float, default=1.5)
    parser.add_argument("--markers", nargs="+", default=["bisect"])
    args = parser.parse_args()
    polygraphy = polygraphy_exe()
    rows = []
    for case in args.cases:
        rows += reduce_case(polygraphy, case, *CASES[case], args.scale, args.markers)
    print_rows(f"reduce against polygraphy run --load-outputs (a Conv's weight x{args.scale})", rows)


def reduce_case(
    polygraphy: str, case: str, model: str, shapes: str, conv: str, scale: float, markers: List[str]
) -> List[Dict[str, Any]]:
    """One case: both tools per marker, and their ratios, as rows."""
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copy(MODELS / model, work / "good.onnx")
        onnx.save(scaled(onnx.load(MODELS / model), conv, scale), work / "bad.onnx")
        for step in (
            [
                *["run", "good.onnx", "--onnxrt", "--input-shapes", shapes, "--save-inputs", "inputs.json"],
                *["--onnx-outputs", "mark", "all", "--save-outputs", "golden.json"],
            ],
            ["data", "merge", "inputs.json", "golden.json", "-o", "all_inputs.json"],
        ):
            _, done = timed([polygraphy, *step], work, {})
            if done.returncode != 0:
                sys.exit(f"polygraphy {step[0]} failed:\n{done.stderr[-2000:]}")
        check = ["run", "--onnxrt", "--load-inputs", "all_inputs.json", "--load-outputs", "golden.json"]
        name, _, dims = shapes.partition(":")
        for marker in markers:
            results = {}
            for tool in ("runner", "polygraphy"):
                out = work / f"{tool}_{marker}.onnx"
                if tool == "runner":
                    command = " ".join([polygraphy, check[0], "{artifact}", *check[1:]])
                    cmd = runner_cmd(
                        "mode=reduce",
                        f"marker={marker}",
                        "model=bad.onnx",
                        f"model_input_shapes={{{name}:{dims}}}",
                        f'checker.cmd="{command}"',
                        f"output={out}",
                        f"hydra.run.dir={work / ('run_' + marker)}",
                    )
                else:
                    cmd = [polygraphy, "debug", "reduce", "bad.onnx", "-o", str(out), "--mode", marker]
                    cmd += ["--model-input-shapes", shapes, "--check", polygraphy, check[0]]
                    cmd += ["polygraphy_debug.onnx", *check[1:]]
                wall, proc = timed(cmd, work, {})
                if proc.returncode != 0 or not out.exists():
                    sys.exit(f"{tool} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                if tool == "runner":
                    checks = json.loads((work / f"run_{marker}" / "summary.json").read_text())["checks"]
                else:
                    checks = (proc.stdout + proc.stderr).count("Running check command")
                compute, _ = compute_nodes(out)
                results[tool] = {"checks": checks, "compute_nodes": compute, "wall_s": round(wall, 1)}
                results[tool]["s_a_check"] = round(wall / max(checks, 1), 2)
            r, p = results["runner"], results["polygraphy"]
            rows += [{"case": case, "marker": marker, "tool": tool, **res} for tool, res in results.items()]
            rows.append(
                {
                    "case": case,
                    "marker": marker,
                    "tool": "ratio runner/polygraphy",
                    "checks": round(r["checks"] / p["checks"], 2),
                    "compute_nodes": round(r["compute_nodes"] / max(p["compute_nodes"], 1), 2),
                    "wall_s": round(r["wall_s"] / p["wall_s"], 2),
                    "s_a_check": round(r["s_a_check"] / p["s_a_check"], 2),
                }
            )
    return rows


if __name__ == "__main__":
    main()
