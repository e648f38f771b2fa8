"""Benchmark: checker=compare (in-process) against an equivalent checker=command (a subprocess
that runs ONNX Runtime and compares with the same golden values), on one reduce run.

Usage: python benchmarks/compare_vs_command.py [--conv 20] [--size 64]
The detector gets one Conv weight multiplied by 10 (a planted numeric fault); both runs must
end at that Conv. Prints checks, final compute nodes and wall time for each, and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from _common import MODELS, compute_nodes, print_rows, runner_cmd, timed
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.checkers.compare import CompareChecker  # noqa: E402
from runner.context import RunContext  # noqa: E402

# the same judgement as checker=compare's defaults, in a separate process per iteration
COMMAND_CHECK = """
import sys
import numpy as np, onnxruntime as ort
golden = np.load(sys.argv[2])
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = {i.name: golden[i.name] for i in sess.get_inputs()}
names = [o.name for o in sess.get_outputs()]
for name, value in zip(names, sess.run(names, feeds)):
    ref = golden[name]
    bad = ~np.isclose(value.astype(np.float64), ref.astype(np.float64), rtol=1e-3, atol=1e-3, equal_nan=True)
    if bad.any() or (~np.isfinite(value) & np.isfinite(ref)).any():
        sys.exit(1)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conv", type=int, default=20, help="index of the Conv whose weight is perturbed")
    parser.add_argument("--size", type=int, default=64, help="input height and width")
    args = parser.parse_args()
    source = MODELS / "ch_PP-OCRv4_det_infer.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        golden = work / "golden.npz"
        checker = CompareChecker.of()
        checker.bind(
            RunContext(
                mode="reduce",
                run_dir=work,
                model_path=source,
                input_shapes={"x": [1, 3, args.size, args.size]},
                save_golden=str(golden),
            )
        )
        model = onnx.load(str(source))
        conv = [n for n in model.graph.node if n.op_type == "Conv"][args.conv]
        const = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == conv.input[1])
        w = numpy_helper.to_array(const.attribute[0].t) * 10.0
        const.attribute[0].t.CopyFrom(numpy_helper.from_array(w.astype(np.float32), const.attribute[0].t.name))
        perturbed = work / "perturbed.onnx"
        onnx.save(model, perturbed)
        script = work / "check.py"
        script.write_text(COMMAND_CHECK)
        common = [f"model={perturbed}", f"golden={golden}", f"model_input_shapes={{x:[1,3,{args.size},{args.size}]}}"]
        rows = []
        for name, extra in (
            ("compare", ["checker=compare"]),
            ("command", [f'checker.cmd="{sys.executable} {script} {{artifact}} {golden}"']),
        ):
            out = work / f"{name}.onnx"
            wall, proc = timed(
                runner_cmd("mode=reduce", *common, *extra, f"output={out}", f"hydra.run.dir={work / name}"), work, {}
            )
            if proc.returncode != 0:
                sys.exit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            summary = __import__("json").loads((work / name / "summary.json").read_text())
            kept = [n.name for n in onnx.load(str(out)).graph.node if n.op_type != "Constant"]
            rows.append(
                {
                    "checker": name,
                    "checks": summary["checks"],
                    "compute_nodes": compute_nodes(out)[0],
                    "found": ",".join(kept),
                    "wall_s": round(wall, 2),
                    "loop_s": summary["wall_s"],
                    "per_check_ms": round(1000 * summary["wall_s"] / summary["checks"], 1),
                }
            )
        rows.append(
            {
                "checker": "ratio compare/command",
                "checks": round(rows[0]["checks"] / rows[1]["checks"], 2),
                "compute_nodes": "",
                "found": "",
                "wall_s": round(rows[0]["wall_s"] / rows[1]["wall_s"], 2),
                "loop_s": round(rows[0]["loop_s"] / rows[1]["loop_s"], 2),
                "per_check_ms": round(rows[0]["per_check_ms"] / rows[1]["per_check_ms"], 2),
            }
        )
        print_rows(f"reduce of the detector with {conv.name} perturbed: in-process compare vs subprocess command", rows)


if __name__ == "__main__":
    main()
