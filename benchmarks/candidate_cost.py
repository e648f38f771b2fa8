"""Benchmark: what one precision candidate costs, phase by phase, beside the check's own run.

For each model and low precision, ``--candidates`` kept sets (random halves of the nodes that can
be kept, the same for every phase) are built as ``mode=precision`` builds them, after the two gates
a run builds first (every node kept, none kept: each weight's forms are made there once), and each
phase is timed apart (median seconds per candidate):

- build: the conversion (fp16) or quantization (int8) of the kept set;
- validate: ``runner.graph.validate`` (onnx.checker and strict type inference);
- prepare: what the checker's backend does before a session (fp16_emulation's rewrite; none for int8);
- session: an ONNX Runtime session on the prepared model (graph optimizations off, as the checks run
  them, but "all" for int8 with ONNX Runtime's placement, which runs its int8 kernels);
- run: one inference on the model's sample.

``overhead`` is everything but the run; issue 34's targets: overhead at most the run on a
recognizer-size model, an int8 candidate at most 3x an fp16 one. Models: the detector (fp16; int8
in both placements), and a Llama-style decoder of 8 blocks of width 1024 (222 MB).

The "switched" rows are how ``checker=compare`` runs the detector's candidates on CPU
(``runner.lowp.switchboard``): fp16's under ``checker.backend=fp16_emulation``
(``runner.lowp.fp16_switchboard``), int8's with TensorRT's placement under ``checker.backend=onnxruntime``
(``runner.lowp.qdq_switchboard``): the same kept sets as feeds of one switched model in one session
(built once, timed apart). Its build is making the feeds; its run is the switched model's; its
overhead is the feeds plus what the switched run costs over the candidate's own run (the built
row's run, measured again here on the same kept sets).

Usage: python benchmarks/candidate_cost.py [--candidates 5] [--size 96]
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Sequence, Tuple

import numpy as np
import onnx
import onnxruntime as ort
from _common import MODELS, print_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.planted import rmsnorm_decoder  # noqa: E402
from runner.backends.fp16_emulation import EmulationBackend  # noqa: E402
from runner.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from runner.graph.qdq import quantized_nodes  # noqa: E402
from runner.graph.sessions import session_for  # noqa: E402
from runner.graph.validate import Validator  # noqa: E402
from runner.lowp.calibration import calibrate  # noqa: E402
from runner.lowp.convert import Converter, float_nodes, prepare  # noqa: E402
from runner.lowp.fp16_switchboard import build_switchboard  # noqa: E402
from runner.lowp.placement import PlacedQuantizer  # noqa: E402
from runner.lowp.precisions import FLOAT16  # noqa: E402
from runner.lowp.qdq_switchboard import build_qdq_switchboard  # noqa: E402
from runner.lowp.quant_options import PLACEMENTS, QuantOptions  # noqa: E402
from runner.lowp.quantize import make_quantizer, prepare_int8  # noqa: E402


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuple[Any, float]:
    """``fn(*args, **kwargs)`` and the seconds it took."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def _measure(
    label: str,
    build: Callable[[Sequence[str]], onnx.ModelProto],
    names: List[str],
    validator: Validator,
    feeds: Dict[str, np.ndarray],
    emulate: bool,
    count: int,
    optimized: bool = False,
) -> Dict[str, object]:
    rng = random.Random(0)
    times: Dict[str, List[float]] = {k: [] for k in ("build", "validate", "prepare", "session", "run")}
    for gate in (names, []):  # a precision run's two gates come first: every node kept, none kept
        build(gate)
    for _ in range(count):
        kept = rng.sample(names, len(names) // 2)
        model, t = _timed(build, kept)
        times["build"].append(t)
        _, t = _timed(validator.check, model, "benchmark")
        times["validate"].append(t)
        if emulate:
            (prepared, _, _), t = _timed(EmulationBackend().prepare, model, None)
        else:
            prepared, t = model, 0.0
        times["prepare"].append(t)
        # the sessions the checks make: unoptimized but for int8 with ONNX Runtime's placement ("all")
        level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess, t = _timed(session_for, prepared, level=level)
        times["session"].append(t)
        fed = {i.name: feeds[i.name] for i in sess.get_inputs()}
        _, t = _timed(sess.run, None, fed)
        times["run"].append(t)
    median = {k: statistics.median(v) for k, v in times.items()}
    overhead = sum(v for k, v in median.items() if k != "run")
    return {
        "candidate": label,
        **{k: f"{v:.3f}" for k, v in median.items()},
        "overhead": f"{overhead:.3f}",
        "total": f"{overhead + median['run']:.3f}",
    }


def _named(
    build: Callable[[List[str]], onnx.ModelProto], model: onnx.ModelProto, kept: FrozenSet[int]
) -> onnx.ModelProto:
    """``build`` of the names of ``model``'s nodes of indices ``kept``."""
    return build([model.graph.node[i].name for i in kept])


def _measure_switched(
    label: str,
    build: Callable[[], Any],
    backend: Any,
    built: Callable[[FrozenSet[int]], onnx.ModelProto],
    layers: List[int],
    feeds: Dict[str, np.ndarray],
    count: int,
) -> Dict[str, object]:
    """The built row's kept sets (random halves of ``layers``) as feeds of the switchboard ``build()``
    makes, run by ``backend`` (``run_as_rounded`` for the emulation); the switched run against the
    candidate's own (``built(kept)``, run unoptimized as the checks run it)."""
    board, made = _timed(build)
    assert board is not None, f"{label}: a switchboard"
    emulated = isinstance(backend, EmulationBackend)
    run = backend.run_as_rounded if emulated else backend.run  # the model rounds itself: no rewrite
    _, first = _timed(run, board.model, {**feeds, **board.feeds(frozenset())}, "board")
    print(f"{label}: switchboard built in {made:.3f} s, its session and first run {first:.3f} s (once per run)")
    rng = random.Random(0)  # the built row's kept sets
    times: Dict[str, List[float]] = {k: [] for k in ("build", "run", "built run")}
    sets = [frozenset(rng.sample(layers, len(layers) // 2)) for _ in range(count)]
    for kept in sets:  # as a run makes them: one session, no other session's threads about
        switches, t = _timed(board.feeds, kept)
        times["build"].append(t)
        _, t = _timed(run, board.model, {**feeds, **switches}, "board")
        times["run"].append(t)
    backend.close()
    for kept in sets:
        model = built(kept)
        prepared = backend.prepare(model, None)[0] if emulated else model
        sess = session_for(prepared, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        _, t = _timed(sess.run, None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        times["built run"].append(t)
        del sess
    median = {k: statistics.median(v) for k, v in times.items()}
    overhead = median["build"] + max(0.0, median["run"] - median["built run"])
    return {
        "candidate": label,
        "build": f"{median['build']:.3f}",
        **{k: "0" for k in ("validate", "prepare", "session")},
        "run": f"{median['run']:.3f}",
        "overhead": f"{overhead:.3f}",
        "total": f"{median['build'] + median['run']:.3f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=5)
    parser.add_argument("--size", type=int, default=96, help="the detector's input side (pixels)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    detector = onnx.load(str(MODELS / "ch_PP-OCRv4_det_infer.onnx"))
    pixels = {"x": (rng.random((1, 3, args.size, args.size)) * 255).astype(np.float32)}

    fp16 = prepare(detector, FLOAT16)
    names = [fp16.graph.node[i].name for i in float_nodes(fp16)]
    converter = Converter(fp16, FLOAT16)
    rows.append(_measure("detector fp16", converter.convert, names, Validator(fp16), pixels, True, args.candidates))
    layers = float_nodes(fp16)
    rows.append(
        _measure_switched(
            "detector fp16, switched",
            functools.partial(build_switchboard, fp16, converter, "benchmark"),
            EmulationBackend(graph_optimization_level="disable"),
            functools.partial(_named, converter.convert, fp16),
            [i for i in layers if fp16.graph.node[i].name in set(names)],
            pixels,
            args.candidates,
        )
    )

    int8 = prepare_int8(detector)
    samples = [{"x": (rng.random((1, 3, args.size, args.size))).astype(np.float32)} for _ in range(4)]
    calibration = calibrate(int8, samples, QuantOptions())
    for placement in PLACEMENTS:
        options = QuantOptions(placement=placement)
        quantizer = make_quantizer(int8, calibration, options)
        quantized = sorted(quantized_nodes(quantizer.convert([])))
        label = f"detector int8 ({placement} placement)"
        optimized = placement == "onnxruntime"  # runner.run.plan: TensorRT's placement runs its Q/DQ as written
        validator = Validator(int8)
        rows.append(
            _measure(label, quantizer.convert, quantized, validator, samples[0], False, args.candidates, optimized)
        )
        if isinstance(quantizer, PlacedQuantizer):  # ONNX Runtime's placement has none (qdq_switchboard)
            placed: PlacedQuantizer = quantizer
            rows.append(
                _measure_switched(
                    f"detector int8 ({placement} placement), switched",
                    functools.partial(build_qdq_switchboard, placed, "benchmark"),
                    OnnxRuntimeBackend(graph_optimization_level="disable"),
                    functools.partial(_named, placed.convert, int8),
                    [i for i, n in enumerate(int8.graph.node) if n.name in quantized],
                    samples[0],
                    args.candidates,
                )
            )

    decoder, _, ids = rmsnorm_decoder(layers=8, dim=1024, vocab=2048, seq=16)
    big = prepare(decoder, FLOAT16)
    names = [big.graph.node[i].name for i in float_nodes(big)]
    label = f"decoder fp16 ({big.ByteSize() / 2**20:.0f} MB)"
    rows.append(_measure(label, Converter(big, FLOAT16).convert, names, Validator(big), {"ids": ids}, True, 3))
    print_rows("precision: seconds per candidate (median), by phase", rows)


if __name__ == "__main__":
    main()
