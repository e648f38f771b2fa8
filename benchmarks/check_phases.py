"""Benchmark: where one precision check's seconds go, phase by phase, on the checker's provider.

For a model and its inputs, ``--candidates`` kept sets (a random ``--kept`` share of the float nodes, the same
seed every time; several shares, comma-separated, are taken in turn: a run's candidates keep from a few nodes to
most) are made as ``mode=precision`` makes fp16 candidates (``runner.lowp.convert.Converter``), after
the two gates a run converts first (every node kept, none: each weight's forms are made there once), and
each phase is timed apart: ``build`` (the conversion), ``session`` (``runner.graph.sessions.session_for`` on the
provider at ONNX Runtime level "all", as ``checker=compare`` builds a candidate's session; a model past
``MAP_BYTES`` of weights maps them from the weight file), ``run`` (one inference on the inputs) and ``compare``
(each output against the fp32 model's by ``runner.checkers.compare.tolerance.compare_outputs``, the check's own
comparison, at relative L2 0.05). On the CUDA provider a session takes the weights earlier sessions left on the
GPU (``runner.graph.device_weights``); ``session_read`` is a second session of the same candidate that reads
every weight from the weight file instead, and its outputs must equal the first's bit for bit; ``session_disable`` one
with graph optimizations off (neither in the total). A one-node model's session on the provider is timed apart:
what any session costs there.
The first candidate warms the provider and is not counted; medians and the largest are printed.

``--switched`` also builds fp16's native switchboard (``runner.lowp.fp16_switchboard``, ``native=True``) and runs
each candidate as its feeds on the provider at level "disable" (``switched``: feeds, run and compare), against
the candidate built and run at that level: how many differ by a bit, and the board's build and first session.

Usage (a GPU machine, ``../shared/gpu/README.md``): python benchmarks/check_phases.py --model M.onnx --inputs I.npz
    [--provider CUDAExecutionProvider] [--candidates 6] [--kept 0.1[,0.5,0.9]] [--switched]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import onnxruntime as ort
from _common import print_rows
from onnx import TensorProto, helper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--provider", default="CUDAExecutionProvider")
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--kept", default="0.1", help="the share of float nodes kept; several: taken in turn")
    parser.add_argument("--switched", action="store_true", help="also time candidates run on the native switchboard")
    args = parser.parse_args()
    from runner.checkers.compare.tolerance import Tolerances, compare_outputs
    from runner.graph.load import load_model
    from runner.graph.sessions import session_for
    from runner.lowp.convert import Converter, float_nodes, prepare

    started = time.perf_counter()
    model = prepare(load_model(Path(args.model)))
    converter = Converter(model)
    names = [model.graph.node[i].name for i in float_nodes(model)]
    feeds = dict(np.load(args.inputs))
    providers = [args.provider]
    fp32 = session_for(model, providers)
    names_out = [o.name for o in fp32.get_outputs()]
    golden = dict(zip(names_out, fp32.run(None, feeds)))
    print(f"loaded, prepared and ran the fp32 model in {time.perf_counter() - started:.1f} s", flush=True)
    for gate in (names, []):  # a run's two gates first: every weight's forms are made there once
        converter.convert(gate)
    rule = Tolerances(atol=0.0, rtol=0.05, stat="rel_l2")
    phase_names = ("build", "session", "run", "compare", "session_read", "session_disable")
    phases: Dict[str, List[float]] = {name: [] for name in phase_names}
    differ = 0
    for i, kept in enumerate(_kept_sets(names, args)):
        t0 = time.perf_counter()
        candidate = converter.convert(kept)
        t1 = time.perf_counter()
        session = session_for(candidate, providers)
        t2 = time.perf_counter()
        outputs = session.run(None, feeds)
        t3 = time.perf_counter()
        _, stats, _ = compare_outputs(dict(zip(names_out, outputs)), golden, rule)
        t4 = time.perf_counter()
        del session
        t5 = time.perf_counter()
        read = session_for(candidate, providers, keep_on_device=False)
        t6 = time.perf_counter()
        same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(outputs, read.run(None, feeds)))
        differ += not same
        del read
        t7 = time.perf_counter()
        session_for(candidate, providers, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        t8 = time.perf_counter()
        worst = max(float(st["rel_l2"]) for st in stats.values())
        print(f"candidate {i}: rel L2 {worst:.3g}, {t4 - t0:.2f} s, bit for bit as read: {same}", flush=True)
        if i:  # the first warms the provider
            for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t6 - t5, t8 - t7)):
                phases[name].append(seconds)
    rows = [
        {"phase": name, "median_s": round(statistics.median(v), 3), "max_s": round(max(v), 3)}
        for name, v in phases.items()
    ]
    total = [sum(phases[k][i] for k in ("build", "session", "run", "compare")) for i in range(args.candidates)]
    rows.append({"phase": "total", "median_s": round(statistics.median(total), 3), "max_s": round(max(total), 3)})
    print_rows(f"one check's phases: {Path(args.model).name} on {args.provider}", rows)
    print(f"{differ} of {args.candidates + 1} candidates differ from their sessions that read every weight")
    if args.switched:
        _switched(model, converter, names, feeds, golden, providers, args, rule)
    tiny = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )
    tiny_s = []
    for _ in range(3):
        t0 = time.perf_counter()
        session_for(tiny, providers)
        tiny_s.append(time.perf_counter() - t0)
    print(f"a one-node model's session on {args.provider}: {statistics.median(tiny_s):.3f} s (median of 3)")


def _kept_sets(names: List[str], args: argparse.Namespace) -> List[List[str]]:
    """The ``--candidates`` + 1 kept sets both timings take, the same each time (seed 0): a random ``--kept`` share
    of ``names``, the shares taken in turn."""
    rng, shares = random.Random(0), [float(k) for k in str(args.kept).split(",")]
    return [rng.sample(names, int(len(names) * shares[i % len(shares)])) for i in range(args.candidates + 1)]


def _switched(model, converter, names, feeds, golden, providers, args, rule) -> None:
    """The ``--switched`` figures: the native switchboard's build and first session, then each candidate as its
    feeds against the candidate built, both at level "disable"."""
    from runner.backends.onnxruntime import OnnxRuntimeBackend
    from runner.checkers.compare.tolerance import compare_outputs
    from runner.graph.sessions import session_for
    from runner.lowp.fp16_switchboard import build_switchboard

    t0 = time.perf_counter()
    board = build_switchboard(model, converter, "native", native=True)
    assert board is not None, "no native switchboard for this model"
    backend = OnnxRuntimeBackend(providers, graph_optimization_level="disable")
    index = {model.graph.node[i].name: i for i in range(len(model.graph.node))}
    t1 = time.perf_counter()
    backend.run(board.model, {**feeds, **board.feeds(frozenset())}, key="native")
    t2 = time.perf_counter()
    print(
        f"native switchboard: built in {t1 - t0:.1f} s ({len(board.switches)} switches), first session {t2 - t1:.1f} s"
    )
    seconds: List[float] = []
    differ = 0
    for kept in _kept_sets(names, args):
        t0 = time.perf_counter()
        got = backend.run(board.model, {**feeds, **board.feeds(frozenset(index[n] for n in kept))}, key="native")
        compare_outputs(got, golden, rule)
        seconds.append(time.perf_counter() - t0)
        built = session_for(converter.convert(kept), providers, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        want = dict(zip([o.name for o in built.get_outputs()], built.run(None, feeds)))
        differ += any(not np.array_equal(got[n], want[n], equal_nan=True) for n in want)
    print(
        f"switched check (feeds, run, compare): median {statistics.median(seconds[1:]):.3f} s, "
        f"largest {max(seconds[1:]):.3f} s; {differ} of {len(seconds)} differ from the built candidate"
    )


if __name__ == "__main__":
    main()
