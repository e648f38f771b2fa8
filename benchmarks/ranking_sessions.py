"""Benchmark: where precision's ranking spends its time (issue 56), per session and run.

Runs ``runner.layerwise.ranking.introduced_ranking`` on the shared text detector in fp16 (fed
unnormalised pixels at ``--size``), on ``--provider`` with the options a ranking takes (``ORDER_PROVIDER_OPTIONS``), in
one chunk or in the chunks of ``--budget-mb`` (precision's ``ranking_memory_mb``), on one lane or on
threads spread over the GPUs given. Each row: the ranking's wall seconds, the sessions it built and
the seconds of each, and its runs (a CUDA session's first run sets up each convolution). The first
row warms CUDA and cuDNN and is printed but not to be compared.

Usage (on the GPU machine; ``../shared/gpu/README.md``):
    python benchmarks/ranking_sessions.py --model PATH [--size 320] [--gpus 0 1] [--lanes 1 4]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx
from _common import MODELS, print_rows

from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.checkers.compare.comparison import ORDER_PROVIDER_OPTIONS
from runner.executors.slot import Slot
from runner.executors.spread import HERE, Lane
from runner.graph.load import load_model
from runner.graph.meta import value_sizes
from runner.layerwise.ranking import introduced_ranking
from runner.lowp.convert import float_nodes, prepare
from runner.lowp.precisions import FLOAT16

DETECTOR = MODELS / "ch_PP-OCRv4_det_infer.onnx"


class TimedBackend(OnnxRuntimeBackend):
    """ONNX Runtime's backend recording the seconds of each session it builds and of each run."""

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.built: List[float] = []
        self.runs: List[float] = []

    def session(self, model: onnx.ModelProto, key: Optional[str]) -> Any:
        with self._lock:
            cached = key is not None and any(k == key or k.startswith(key + "@") for k in self._sessions)
        began = time.perf_counter()
        session = super().session(model, key)
        if not cached:
            self.built.append(time.perf_counter() - began)
        return session

    def run(
        self,
        model: onnx.ModelProto,
        feeds: Mapping[str, np.ndarray],
        key: Optional[str] = None,
        outputs: Optional[Sequence[str]] = None,
    ) -> Dict[str, np.ndarray]:
        began = time.perf_counter()
        got = super().run(model, feeds, key, outputs)
        self.runs.append(time.perf_counter() - began)
        return got


def one(
    model: onnx.ModelProto, size: int, provider: str, lanes: int, gpus: Sequence[str], budget_mb: Optional[float]
) -> Dict[str, Any]:
    """One ranking: a row of its wall seconds, sessions built and runs (each with its seconds)."""
    options = {provider: ORDER_PROVIDER_OPTIONS.get(provider, {})}  # what a ranking's sessions use
    backend = TimedBackend(providers=[provider], provider_options=options, cpu_arena=False)
    x = (np.random.default_rng(0).random((1, 3, size, size)) * 255).astype(np.float32)
    budget = None if budget_mb is None else int(budget_mb * 2**20)
    sizes = value_sizes(model, {"x": [1, 3, size, size]}, None) if budget is not None else None
    spread_on = HERE if lanes == 1 else [Lane(Slot(w, gpus[w % len(gpus)] if gpus else None)) for w in range(lanes)]
    began = time.perf_counter()
    introduced_ranking(
        model, float_nodes(model), [{"x": x}], FLOAT16, backend, lanes=spread_on, budget=budget, sizes=sizes
    )
    return {
        "lanes": lanes,
        "budget_mb": budget_mb,
        "wall_s": round(time.perf_counter() - began, 2),
        "sessions": len(backend.built),
        "sessions_s": round(sum(backend.built), 2),
        "runs": len(backend.runs),
        "runs_s": round(sum(backend.runs), 2),
        "slowest_runs_s": sorted((round(r, 2) for r in backend.runs), reverse=True)[:4],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DETECTOR)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--provider", default="CUDAExecutionProvider", help="CPUExecutionProvider: a dry run")
    parser.add_argument("--gpus", nargs="*", default=["0", "1"], help="the lanes' GPUs, taken in turn")
    parser.add_argument("--lanes", nargs="+", type=int, default=[1, 4, 2])
    parser.add_argument("--budget-mb", type=float, default=512.0, help="ranking_memory_mb; the rows also run with none")
    args = parser.parse_args()
    gpus = args.gpus if args.provider != "CPUExecutionProvider" else []
    model = prepare(load_model(str(args.model)), FLOAT16)
    rows = [one(model, args.size, args.provider, 1, gpus, None)]  # warms CUDA and cuDNN
    rows[0]["lanes"] = "1 (warm-up)"
    for lanes in args.lanes:
        for budget in (args.budget_mb, None):
            rows.append(one(model, args.size, args.provider, lanes, gpus, budget))
    print_rows(f"Precision's ranking, detector {args.size}x{args.size}, {args.provider}", rows)


if __name__ == "__main__":
    main()
