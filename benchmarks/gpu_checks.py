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
from typing import Any, Dict, List, Optional, Sequence

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
    from runner.lowp.convert import Converter, float_nodes, prepare

    model = prepare(onnx.load(str(model_path)))
    converter = Converter(model)
    nodes = [model.graph.node[i].name for i in float_nodes(model)]
    picks = [nodes[(i * 37) % len(nodes)] for i in range(checks + 1)]
    rows: List[Dict[str, Any]] = []
    for name, options, level in CONFIGS:
        checker = CompareChecker.of(
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


#: worker processes started with the run, not once a check here is dear (``executor.start=lazy``)
START_NOW = "executor.start=now"


def executors(gpus: int) -> List[tuple]:
    """(label, overrides) of the executors compared; those labelled ``now:`` start their workers
    with the run."""
    rows = [
        ("serial", []),
        ("local 2 threads, 1 GPU", ["executor=local", "executor.workers=2", "executor.gpus=[0,0]"]),
        ("processes 2, 1 GPU", ["executor=processes", "executor.gpus=[0]", "executor.per_gpu=2"]),
        ("processes 4, 1 GPU", ["executor=processes", "executor.gpus=[0]", "executor.per_gpu=4"]),
        ("now: processes 2, 1 GPU", ["executor=processes", "executor.gpus=[0]", "executor.per_gpu=2", START_NOW]),
    ]
    if gpus >= 2:
        rows += [
            ("local 4 threads, 2 GPUs", ["executor=local", "executor.workers=4", "executor.gpus=[0,1,0,1]"]),
            ("processes 2, 2 GPUs", ["executor=processes", "executor.gpus=[0,1]", "executor.per_gpu=1"]),
            ("processes 4, 2 GPUs", ["executor=processes", "executor.gpus=[0,1]", "executor.per_gpu=2"]),
            (
                "now: processes 4, 2 GPUs",
                ["executor=processes", "executor.gpus=[0,1]", "executor.per_gpu=2", START_NOW],
            ),
        ]
    return rows


#: the session options of the runs: the defaults (cheap sessions), and cuDNN's exhaustive convolution
#: search per session (ONNX Runtime's own default: checks about 16x dearer, as every check was before
#: checker.provider_options; TF32 stays off, with it the all-fp32 candidate fails against CPU golden outputs)
SESSIONS = {
    "cheap": [],
    "exhaustive": ["checker.provider_options.CUDAExecutionProvider.cudnn_conv_algo_search=EXHAUSTIVE"],
}

#: the runs' modes: their overrides
MODES = {
    "precision": ["mode=precision", "marker=bisect", "direction=ranked"],
    "reduce": ["mode=reduce", "checker.low_precision=float16"],
}


def one_run(model_path: Path, inputs: Path, work: Path, provider: str, args: List[str], tag: str) -> Dict[str, Any]:
    """One ``python -m runner`` run with ``args`` (mode, executor, sessions) in ``work/tag``: a row of
    its wall seconds, ``summary.json``'s run seconds, checks, rounds, checks run in the runner's
    process, when the worker processes started (``workers_started_s``), the checks' seconds (sum
    and median), the median hand-over (``verdict_s - check_s``) and the answer; ``answer`` says how
    a failed run ended."""
    run_dir = work / tag
    cmd = runner_cmd(
        *args,
        f"model={model_path}",
        f"inputs={inputs}",
        "checker=compare",
        "checker.backend=onnxruntime",
        f"checker.providers=[{provider}]",
        *TOLERANCE,
        f"hydra.run.dir={run_dir}",
        f"output={run_dir}/answer.onnx",
    )
    wall, proc = timed(cmd, work, {})
    row: Dict[str, Any] = dict.fromkeys(
        [
            "wall_s",
            "run_s",
            "checks",
            "rounds",
            "check_s",
            "check_median_s",
            "local_checks",
            "started_s",
            "dispatch_median_s",
        ]
    )
    row["wall_s"] = round(wall, 1)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        row["answer"] = f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:80]}"
        return row
    s = json.loads((run_dir / "summary.json").read_text())
    replay = json.loads((run_dir / "replay.json").read_text())["iterations"]
    ran = [e["details"] for e in replay if not e["reused"] and "check_s" in e["details"]]
    per_check = [d["check_s"] for d in ran]
    handover = [d["verdict_s"] - d["check_s"] for d in ran if "verdict_s" in d]
    names = [n["name"] for n in s.get("kept_nodes", s.get("reduced_nodes", []))]
    row.update(
        run_s=s["wall_s"],
        checks=s["checks"],
        rounds=s.get("rounds", s["checks"]),
        check_s=s.get("check_s"),
        check_median_s=round(statistics.median(per_check), 3) if per_check else None,
        local_checks=s.get("local_checks"),
        started_s=s.get("workers_started_s"),
        dispatch_median_s=round(statistics.median(handover), 3) if handover else None,
        answer=f"{len(names)}: {','.join(names[:4])}{'...' if len(names) > 4 else ''}",
    )
    return row


def runs(
    model_path: Path,
    inputs: Path,
    gpus: int,
    work: Path,
    provider: str,
    sessions: List[str],
    keep: Optional[Path],
    modes: List[str],
    repeat: int = 1,
    only: Optional[List[str]] = None,
    extra: Sequence[str] = (),
) -> List[Dict]:
    """Rows: per mode, session options and executor, the median run of ``repeat`` (by ``summary.json``'s
    run seconds, with the ratio to serial's and every run's seconds); the executors take turns, so a
    slow spell of the machine hits them alike. Each mode and session begins with a serial run that
    is not counted (it warms the disk cache, CUDA and cuDNN). ``modes``: keys of ``MODES``; ``only``:
    the executors whose label starts with one of these (serial always runs); ``keep``: copy each
    counted run's log, replay and summary there; ``extra``: overrides added to every run."""
    chosen = [
        (label, overrides)
        for label, overrides in executors(gpus)
        if label == "serial" or not only or any(label.startswith(o) for o in only)
    ]
    rows: List[Dict[str, Any]] = []
    for mode, session in itertools.product(modes, sessions):
        base = MODES[mode] + SESSIONS[session] + list(extra)
        one_run(model_path, inputs, work, provider, base, f"{mode}_{session}_warm-up")
        tried: Dict[str, List[Dict[str, Any]]] = {label: [] for label, _ in chosen}
        for turn, (label, overrides) in itertools.product(range(repeat), chosen):
            tag = f"{mode}_{session}_{label}_{turn}".replace(" ", "_").replace(",", "")
            row = one_run(model_path, inputs, work, provider, base + overrides, tag)
            print({"mode": mode, "sessions": session, "executor": label, **row}, flush=True)
            tried[label].append(row)
            if keep is not None:
                for name in ("runner.log", "replay.json", "summary.json"):
                    if (work / tag / name).exists():
                        (keep / tag).mkdir(parents=True, exist_ok=True)
                        shutil.copy(work / tag / name, keep / tag / name)
        serial_s = None
        for label, _ in chosen:
            done = [r for r in tried[label] if r["run_s"] is not None]
            row = sorted(done, key=lambda r: r["run_s"])[(len(done) - 1) // 2] if done else tried[label][0]
            serial_s = serial_s or row["run_s"]
            ratio = round(row["run_s"] / serial_s, 2) if row["run_s"] and serial_s else None
            runs_s = [r["run_s"] for r in tried[label]]
            rows.append(
                {"mode": mode, "sessions": session, "executor": label, **row, "run_ratio": ratio, "runs_s": runs_s}
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DETECTOR)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--part", choices=["overhead", "runs", "all"], default="all")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--checks", type=int, default=6, help="checks per session configuration (overhead)")
    parser.add_argument("--sessions", nargs="+", choices=list(SESSIONS), default=list(SESSIONS))
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--repeat", type=int, default=1, help="runs per executor (runs part); the median counts")
    parser.add_argument("--only", nargs="+", help="executors whose label starts with one of these (and serial)")
    parser.add_argument("--provider", default="CUDAExecutionProvider", help="CPUExecutionProvider: a dry run")
    parser.add_argument("--extra", nargs="+", default=[], help="overrides added to every run (verbose=true)")
    parser.add_argument("--keep", type=Path, help="copy each run's runner.log, replay.json and summary.json here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpu_checks_"))
    inputs = work / "pixels.npz"
    pixels(inputs, args.size)
    if args.part in ("overhead", "all"):
        rows = overhead(args.model, inputs, args.checks, args.provider)
        print_rows(f"Per-check cost, detector {args.size}x{args.size}, {args.provider}", rows)
    if args.part in ("runs", "all"):
        rows = runs(
            args.model,
            inputs,
            args.gpus,
            work,
            args.provider,
            args.sessions,
            args.keep,
            args.modes,
            args.repeat,
            args.only,
            args.extra,
        )
        print_rows(f"Runs, detector {args.size}x{args.size}, {args.provider}", rows)


if __name__ == "__main__":
    main()
