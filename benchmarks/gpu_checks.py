"""Benchmark: in-process CUDA checks (issue 24), run on a GPU machine with onnxruntime-gpu.

Two parts, on the shared text detector fed unnormalised pixels (0-255) at ``--size`` (320: the
largest shared model at a recognizer's cost per check):

- ``overhead``: the cost of one compare check of a precision candidate (the detector in fp16
  except one node) on ``CUDAExecutionProvider``, in this process, per session configuration:
  ONNX Runtime's defaults (what every check paid before ``checker.provider_options``), cuDNN's
  heuristic or default convolution algorithm choice instead of its exhaustive search, and lower
  graph optimization levels. Each check is a new candidate (a new session); the first check of a
  configuration warms CUDA and is not counted. ``build_s`` is the runner's own cost of making the
  candidate (the fp16 conversion), the same for every configuration.
- ``runs``: whole ``python -m runner`` runs of ``mode=precision marker=bisect direction=ranked`` and
  ``mode=reduce`` (the fp32 detector with ``checker.low_precision=float16``: the smallest subgraph
  whose fp16 run fails), ``checker=compare`` on CUDA, serial against ``executor=local`` (threads)
  and ``executor=processes`` with 2 and 4 workers on 1 GPU and, with ``--gpus 2``, on 2 GPUs.

Usage (on the GPU machine; ``../shared/gpu/README.md``):
    python benchmarks/gpu_checks.py --model PATH [--size 320] [--part overhead|runs|all] [--gpus 1|2]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import onnx
from _common import MODELS, print_rows, runner_cmd, timed

DETECTOR = MODELS / "ch_PP-OCRv4_det_infer.onnx"
TOLERANCE = ["checker.atol=0.05", "checker.rtol=0", "checker.max_mismatch_fraction=0.01"]

#: session configurations of the overhead part: (name, provider_options, graph_optimization_level)
CONFIGS = [
    ("ort defaults (before)", {}, "all"),
    ("cudnn heuristic", {"cudnn_conv_algo_search": "HEURISTIC"}, "all"),
    ("cudnn default", {"cudnn_conv_algo_search": "DEFAULT"}, "all"),
    ("cudnn heuristic, basic", {"cudnn_conv_algo_search": "HEURISTIC"}, "basic"),
    ("cudnn heuristic, disable", {"cudnn_conv_algo_search": "HEURISTIC"}, "disable"),
    ("cudnn default, no tf32 (default)", {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": "0"}, "all"),
    ("cudnn default, no tf32, basic", {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": "0"}, "basic"),
]


def pixels(path: Path, size: int) -> None:
    """One 0-255 sample for the detector's input, saved as ``.npz``."""
    x = (np.random.default_rng(0).random((1, 3, size, size)) * 255).astype(np.float32)
    np.savez(path, x=x)


def overhead(model_path: Path, inputs: Path, checks: int, provider: str) -> List[Dict]:
    """Rows: per configuration, the median seconds of a check and of building its candidate."""
    from runner.candidates import Candidate
    from runner.checkers.compare import CompareChecker
    from runner.context import RunContext
    from runner.graph.convert import Converter, float_nodes, prepare

    model = prepare(onnx.load(str(model_path)))
    converter = Converter(model)
    nodes = [model.graph.node[i].name for i in float_nodes(model)]
    picks = [nodes[(i * 37) % len(nodes)] for i in range(checks + 1)]
    rows: List[Dict[str, Any]] = []
    for name, options, level in CONFIGS:
        checker = CompareChecker(
            backend="onnxruntime",
            providers=[provider],
            provider_options={provider: options},
            graph_optimization_level=level,
            atol=0.05,
            rtol=0,
            max_mismatch_fraction=0.01,
        )
        with tempfile.TemporaryDirectory() as run_dir:
            checker.bind(RunContext(mode="precision", run_dir=Path(run_dir), model_path=model_path, inputs=str(inputs)))
        builds, times = [], []
        for i, keep in enumerate(picks):
            start = time.perf_counter()
            candidate_model = converter.convert([keep])
            built = time.perf_counter()
            payload = functools.partial(_same, candidate_model)
            candidate = Candidate(f"keep {keep}", keep, payload=payload, as_typed=True)
            checker.check(None, i + 1, candidate)
            done = time.perf_counter()
            if i:  # the first check warms CUDA and cuDNN
                builds.append(built - start)
                times.append(done - built)
        checker.close()
        rows.append(
            {
                "session": name,
                "provider_options": json.dumps(options),
                "level": level,
                "check_s": round(statistics.median(times), 3),
                "build_s": round(statistics.median(builds), 3),
            }
        )
        print(rows[-1], flush=True)
    base = rows[0]["check_s"]
    for row in rows:
        row["ratio"] = round(row["check_s"] / base, 2)
    return rows


def _same(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


def executors(gpus: int) -> List[tuple]:
    """(label, overrides) of the executors compared."""
    rows = [
        ("serial", []),
        ("local 2 threads, 1 GPU", ["executor=local", "executor.workers=2", "executor.gpus=[0,0]"]),
        ("processes 2, 1 GPU", ["executor=processes", "executor.gpus=[0]", "executor.per_gpu=2"]),
        (
            "processes 2, 1 GPU, no local start",
            ["executor=processes", "executor.gpus=[0]", "executor.per_gpu=2", "executor.local_start=false"],
        ),
        ("processes 4, 1 GPU", ["executor=processes", "executor.gpus=[0]", "executor.per_gpu=4"]),
    ]
    if gpus >= 2:
        rows += [
            ("local 4 threads, 2 GPUs", ["executor=local", "executor.workers=4", "executor.gpus=[0,1,0,1]"]),
            ("processes 2, 2 GPUs", ["executor=processes", "executor.gpus=[0,1]", "executor.per_gpu=1"]),
            ("processes 4, 2 GPUs", ["executor=processes", "executor.gpus=[0,1]", "executor.per_gpu=2"]),
        ]
    return rows


#: the session options of the runs: the defaults (cheap sessions), and ONNX Runtime's own
#: (cuDNN's exhaustive search per session: checks 16x dearer, as before checker.provider_options)
#: (a dict override merges into the default, so the default's keys are set back to ONNX Runtime's values)
SESSIONS = {
    "cheap": [],
    "ort defaults": [
        "checker.provider_options.CUDAExecutionProvider.cudnn_conv_algo_search=EXHAUSTIVE",
        "checker.provider_options.CUDAExecutionProvider.use_tf32=1",
    ],
}


def runs(
    model_path: Path, inputs: Path, gpus: int, work: Path, provider: str, sessions: List[str], keep: Optional[Path]
) -> List[Dict]:
    """Rows: per mode, session options and executor, wall seconds, checks, rounds, the answer,
    the ratio to serial, the seconds of the checks where they ran (sum and median), the checks run
    in the runner's process while the workers started. ``keep``: copy each run's log, replay and
    summary there."""
    modes = {
        "precision bisect ranked": ["mode=precision", "marker=bisect", "direction=ranked"],
        "reduce": ["mode=reduce", "checker.low_precision=float16"],
    }
    rows: List[Dict[str, Any]] = []
    for (mode, args), session in itertools.product(modes.items(), sessions):
        serial_s = None
        for label, overrides in executors(gpus):
            tag = f"{mode.split()[0]}_{session}_{label}".replace(" ", "_").replace(",", "")
            run_dir = work / tag
            cmd = runner_cmd(
                *args,
                f"model={model_path}",
                f"inputs={inputs}",
                "checker=compare",
                "checker.backend=onnxruntime",
                f"checker.providers=[{provider}]",
                *TOLERANCE,
                *overrides,
                *SESSIONS[session],
                f"hydra.run.dir={run_dir}",
                f"output={run_dir}/answer.onnx",
            )
            wall, proc = timed(cmd, work, {})
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                last = (proc.stderr.strip().splitlines() or [""])[-1][:80]
                rows.append(
                    dict(
                        mode=mode,
                        sessions=session,
                        executor=label,
                        wall_s=round(wall, 1),
                        run_s=None,
                        run_ratio=None,
                        checks=None,
                        rounds=None,
                        answer=f"exit {proc.returncode}: {last}",
                    )
                )
                continue
            s = json.loads((run_dir / "summary.json").read_text())
            replay = json.loads((run_dir / "replay.json").read_text())["iterations"]
            ran = [e["details"] for e in replay if not e["reused"] and "check_s" in e["details"]]
            per_check = [d["check_s"] for d in ran]
            overhead_s = [d["verdict_s"] - d["check_s"] for d in ran if "verdict_s" in d]
            if keep is not None:
                for name in ("runner.log", "replay.json", "summary.json"):
                    if (run_dir / name).exists():
                        (keep / tag).mkdir(parents=True, exist_ok=True)
                        shutil.copy(run_dir / name, keep / tag / name)
            names = [n["name"] for n in s.get("kept_nodes", s.get("reduced_nodes", []))]
            serial_s = serial_s or s["wall_s"]
            rows.append(
                {
                    "mode": mode,
                    "sessions": session,
                    "executor": label,
                    "wall_s": round(wall, 1),
                    "run_s": s["wall_s"],
                    "run_ratio": round(s["wall_s"] / serial_s, 2),
                    "checks": s["checks"],
                    "rounds": s.get("rounds", s["checks"]),
                    "check_s": s.get("check_s"),
                    "check_median_s": round(statistics.median(per_check), 3) if per_check else None,
                    "local_checks": s.get("local_checks"),
                    "dispatch_median_s": round(statistics.median(overhead_s), 3) if overhead_s else None,
                    "answer": f"{len(names)}: {','.join(names[:4])}{'...' if len(names) > 4 else ''}",
                }
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DETECTOR)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--part", choices=["overhead", "runs", "all"], default="all")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--checks", type=int, default=6, help="checks per session configuration (overhead)")
    parser.add_argument("--sessions", nargs="+", choices=list(SESSIONS), default=list(SESSIONS))
    parser.add_argument("--provider", default="CUDAExecutionProvider", help="CPUExecutionProvider: a dry run")
    parser.add_argument("--keep", type=Path, help="copy each run's runner.log, replay.json and summary.json here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu_checks_"))
    inputs = work / "pixels.npz"
    pixels(inputs, args.size)
    if args.part in ("overhead", "all"):
        rows = overhead(args.model, inputs, args.checks, args.provider)
        print_rows(f"Per-check cost, detector {args.size}x{args.size}, {args.provider}", rows)
    if args.part in ("runs", "all"):
        rows = runs(args.model, inputs, args.gpus, work, args.provider, args.sessions, args.keep)
        print_rows(f"Runs, detector {args.size}x{args.size}, {args.provider}", rows)


if __name__ == "__main__":
    main()
