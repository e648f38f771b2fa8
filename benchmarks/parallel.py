"""Benchmark: parallel checks (issue 13). The detector with a node-presence check that sleeps, serial
against ``executor=local`` with 2, 4 and 8 workers: checks, rounds, wall time, the ratio to serial,
and the answer (the same each time).

Rows:
- ``reduce bisect|linear|minimal``: ``mode=reduce`` with each marker, i.e. the set search (the check
  fails while the chosen Conv is in the subgraph). Bisect checks the next tests of its serial search's
  decision tree (3 workers decide 2 serial steps a round), linear checks
  k subgraphs at once, and the probe of the needed node alone shares a round with the next splits.
- ``precision bisect|linear``: ``mode=precision`` (Polygraphy's prefix search; the check passes when
  the chosen Conv is kept in float32). Each of its candidates takes 0.12 to 0.25 s of the runner's
  own time to build (the float16 conversion, under the GIL); look-ahead builds some of the next
  round's while a round's checks run.

Columns: ``wall_s`` is the whole process, ``run_s`` the run itself (``summary.json``'s ``wall_s``,
without the interpreter and Hydra start-up that every executor pays alike); ``ratio`` and
``run_ratio`` compare each with serial.

The check is ``checker=python`` (in-process: a sleeping subprocess per check would measure process
start-up on a 2-core machine, not the search). Targets: with 4 workers, bisect at most 0.45x serial
wall time, linear at most 0.3x (the reduce rows, run time).

Usage: python benchmarks/parallel.py [--sleep 1.0] [--workers 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import onnx
from _common import MODELS, print_rows, run_job

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = MODELS / "ch_PP-OCRv4_det_infer.onnx"
#: a Conv 50 nodes from the end of the detector: bisect needs about log2(330) checks, linear about 25
NODE = "p2o.Conv.50"


def kept_in_fp32(path: str, name: str, sleep_s: str) -> bool:
    """Precision's check: passes when node ``name`` runs in float32 (its weight, a Constant or an
    initializer, is not fp16; a kept node reads it through a Cast)."""
    model = onnx.load(path, load_external_data=False)
    producers = {o: n for n in model.graph.node for o in n.output}
    node = next(n for n in model.graph.node if n.name == name)
    time.sleep(float(sleep_s))
    initializers = {t.name: t for t in model.graph.initializer}
    weight = producers.get(node.input[1])
    tensor = (
        weight.attribute[0].t
        if weight is not None and weight.op_type == "Constant"
        else initializers.get(node.input[1])
    )
    return tensor is None or tensor.data_type != onnx.TensorProto.FLOAT16


def without_node(path: str, name: str, sleep_s: str) -> bool:
    """Reduce's check: fails while node ``name`` is in the model."""
    names = {n.name for n in onnx.load(path, load_external_data=False).graph.node}
    time.sleep(float(sleep_s))
    return name not in names


RUNS = {
    "reduce bisect": ["mode=reduce", "marker=bisect", "checker.target=parallel.without_node"],
    "reduce linear": ["mode=reduce", "marker=linear", "checker.target=parallel.without_node"],
    "reduce minimal": ["mode=reduce", "marker=minimal", "checker.target=parallel.without_node"],
    "precision bisect": ["mode=precision", "marker=bisect", "checker.target=parallel.kept_in_fp32"],
    "precision linear": ["mode=precision", "marker=linear", "checker.target=parallel.kept_in_fp32"],
}


def run(name: str, workers: int, sleep_s: float, work: Path) -> Dict:
    """One run; its row (checks, rounds, wall seconds, the answer)."""
    out = work / f"{name.replace(' ', '_')}_{workers}"
    executor = ["executor=serial"] if workers == 1 else ["executor=local", f"executor.workers={workers}"]
    args = [*RUNS[name], f"model={DETECTOR}", "checker=python", f"checker.args=[{NODE},{sleep_s}]", *executor]
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}
    wall, summary = run_job([*args, f"output={out}.onnx"], out, ROOT, f"{name} with {workers} workers", env)
    answer = summary.get("reduced_nodes") or summary.get("kept_nodes") or summary.get("kept")
    return {
        "search": name,
        "workers": workers,
        "checks": summary["checks"],
        "rounds": summary["rounds"],
        "cancelled": summary.get("cancelled", 0),
        "wall_s": round(wall, 1),
        "run_s": round(summary["wall_s"], 1),
        "answer": json.dumps(answer, sort_keys=True)[:60],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each check sleeps")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args()
    if not DETECTOR.is_file():
        raise SystemExit(f"{DETECTOR} is missing; set RUNNER_SHARED_MODELS")
    rows: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            serial = run(name, 1, args.sleep, Path(tmp))
            rows.append({**serial, "ratio": 1.0, "run_ratio": 1.0, "same_answer": True})
            for workers in args.workers:
                row = run(name, workers, args.sleep, Path(tmp))
                rows.append(
                    {
                        **row,
                        "ratio": round(row["wall_s"] / serial["wall_s"], 2),
                        "run_ratio": round(row["run_s"] / serial["run_s"], 2),
                        "same_answer": row["answer"] == serial["answer"],
                    }
                )
            print(f"{name}: done", file=sys.stderr, flush=True)
    print_rows(
        f"Parallel checks on the detector (check sleeps {args.sleep} s; this machine: {os.cpu_count()} cores)", rows
    )


if __name__ == "__main__":
    main()
