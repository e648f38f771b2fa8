"""Rank nodes by the error each introduces in a low precision: one rule (``error_key``) for
precision's searches and for ``mode=layerwise``'s ``top_introduced``, on every backend.

The whole model is converted to the low precision and compared node by node with its fp32 run
(``LayerwiseComparison``): a few model runs, whatever the checker. The rule, larger first:

1. nodes whose error reaches an output: a node whose NaN/Inf or lost values are absorbed before
   any output (GPT-2's causal mask, -inf in fp16, which its Softmax reads as fp32's -3.4e38) goes
   after every other (``absorbed``: absorbed only where the absorbing node's values are back near
   the reference, not merely finite: RMSNorm's x*x overflows to inf and 1/sqrt(inf) = 0 is finite
   but loses the whole tensor);
2. nodes that, run alone in the low precision, make NaN/Inf;
3. nodes that read a value past the type's range (their producer's overflow reaches them: they
   must read it in fp32 too);
4. the relative L2 error each introduces, run alone on exact inputs;
5. the larger magnitude of their values and weights.

(On the detector fed 0-255 pixels this order puts the three nodes a 1-minimal kept set needs at
places 1, 2 and 12 of 330; ordering by the largest absolute error or by magnitude alone scatters
them far wider.) Where the comparison cannot run, ``sensitivity_ranking`` orders by magnitude
alone, from the fp32 run's summaries.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from runner.backends.base import Backend, make_backend
from runner.checkers.base import Checker
from runner.checkers.compare.tolerance import Tolerances
from runner.errors import ModelError
from runner.executors.spread import HERE
from runner.graph.summaries import TensorSummary, summarize
from runner.layerwise.compute import LayerwiseComparison, NodeRow
from runner.layerwise.tensors import nan_as_inf, weight_peaks
from runner.lowp.convert import to_low_precision
from runner.lowp.precisions import LowPrecision, is_quantized

log = logging.getLogger(__name__)


#: accumulated relative L2 error at which a tensor's values count as lost (``lost``): far above any
#: rounding (fp16's is about 1e-3, int8's 1e-2), far below a tensor zeroed or saturated (1)
LOST_REL_L2 = 0.1


def error_key(row: NodeRow) -> Tuple[bool, bool, bool, float, float]:
    """Sort key of the one ranking rule (module docstring), larger first: (not absorbed, NaN/Inf
    made alone, a saturated input, introduced relative L2 error with NaN as the worst, magnitude).
    A row never run alone sorts after every row that was, among the rows equally absorbed."""
    size = max(row.magnitude, row.weights)
    intro = row.introduced
    kept = row.absorbed_by is None
    if intro is None:
        return (kept, False, False, -1.0, size)
    return (kept, intro["new_nonfinite"] > 0, bool(row.saturated), nan_as_inf(intro["rel_l2"]), size)


def makes_nonfinite(row: NodeRow) -> bool:
    """Whether a row's outputs hold NaN/Inf in the low-precision run where the reference has none."""
    return bool(row.accumulated) and row.accumulated.get("new_nonfinite", 0) > 0


def lost(row: NodeRow) -> bool:
    """Whether a row's outputs in the low-precision run are NaN/Inf where the reference has none,
    or so far off that the values are lost (accumulated relative L2 error >= ``LOST_REL_L2``): the
    divergence that ``absorbed`` follows to an output."""
    return makes_nonfinite(row) or (
        bool(row.accumulated) and nan_as_inf(row.accumulated.get("rel_l2", 0.0)) >= LOST_REL_L2
    )


def ranking_backend(checker: Optional[Checker]) -> Optional[Backend]:
    """A backend like the checker's own when it judges on a device (so precision's ranking sees the
    device's arithmetic, e.g. its fp16 kernels; ``Comparison.backend``: its sessions of
    marked models are not left in the checker's cache, and on the CUDA provider they choose cuDNN's
    default algorithms, no search, as an order allows), else None: ``introduced_ranking`` then runs
    fp16/bf16 emulation on CPU (ONNX Runtime's CPU provider computes many fp16 ops in fp32), or for int8
    ONNX Runtime on CPU (it runs Q/DQ as written). ``introduced_ranking`` closes either."""
    comparison = checker.comparison() if checker is not None else None
    if comparison is not None and comparison.on_device:
        log.info("Nodes are ranked on the checker's backend (%s, %s)", comparison.backend_name, comparison.providers)
        return comparison.backend(for_order=True)
    return None


def introduced_ranking(
    model: onnx.ModelProto,
    layers: Sequence[int],
    samples: Sequence[Mapping[str, np.ndarray]],
    low: LowPrecision,
    backend: Optional[Backend] = None,
    target: Optional[onnx.ModelProto] = None,
    lanes: Sequence[Any] = HERE,
    budget: Optional[int] = None,
    sizes: Optional[Mapping[str, int]] = None,
) -> Optional[List[int]]:
    """``layers`` (indices into ``model.graph.node``) ordered by ``error_key``, largest first;
    ties keep topological order.

    Args:
        model: the fp32 model, nodes named.
        layers: the node indices that can be kept.
        samples: input feed dicts.
        low: float16, bfloat16 or int8.
        backend: runs the low-precision model and its nodes alone (``ranking_backend``); None:
            emulation on CPU (ONNX Runtime on CPU for int8). Closed at the end either way.
        target: the whole model in the low precision; None: ``to_low_precision(model, low)``. For
            int8 the fully quantized QDQ model: each node then runs alone with its own Q/DQ pairs,
            the error it introduces when it alone is quantized.
        lanes: runs the nodes alone (``Executor.lanes``: the run's executor spreads them over
            its worker processes, each on its GPU, while this process runs them too).
        budget: bytes of tensor values held at once (``LayerwiseComparison``'s chunks), or None for no limit.
        sizes: ``{tensor: bytes}`` of ``model``'s tensors for the chunks (needed with ``budget``).

    Returns:
        The ranking, or None when the model cannot be converted or run (the caller falls back).
    """
    names = {model.graph.node[i].name: i for i in layers}
    # every tensor is marked: a session's CPU arena would keep all the values of a run until the end
    reference = make_backend("onnxruntime", graph_optimization_level="disable", cpu_arena=False)
    if backend is None:  # rounds fp16 and bf16 tensors alike; int8 runs its Q/DQ as written
        backend = make_backend("onnxruntime" if is_quantized(low) else "fp16_emulation", cpu_arena=False)
    try:
        target = target if target is not None else to_low_precision(model, low)
        comparison = LayerwiseComparison(
            model,
            target,
            set(names),
            weight_peaks(model),
            reference.run,
            backend,
            Tolerances(stat="rel_l2"),  # the ranking reads no verdict: no element-wise pass
            low,
            budget,
            sizes,
            pairs=False,
            lanes=lanes,
        )
        rows = comparison.run(samples)
        log.info("Ranking: %s", ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in comparison.seconds.items()))
        by_name = {r.node: r for r in rows}
        for name, by in comparison.absorbed(rows, lost).items():
            by_name[name].absorbed_by = by or "(nothing reads it)"
    except ModelError as e:
        log.warning("Cannot rank nodes by introduced error (%s); ranking by magnitude", e)
        return None
    finally:  # a large model's sessions would stay beside the search's
        reference.close()
        backend.close()
    score = {names[r.node]: error_key(r) for r in rows if r.node in names}
    lowest = (False, False, False, -1.0, 0.0)
    return sorted(layers, key=lambda i: score.get(i, lowest), reverse=True) if score else None


def sensitivity_ranking(model: onnx.ModelProto, layers: List[int], summaries: Mapping[str, TensorSummary]) -> List[int]:
    """Order ``layers`` by the largest magnitude among each node's outputs and weights, largest first.

    Args:
        model: the fp32 model (Constant nodes already initializers).
        layers: node indices to rank.
        summaries: the fp32 run's summary of each tensor (its peak magnitude; one reference run,
            streamed in bounded memory).

    Returns:
        ``layers`` reordered; nodes whose values pass the fp16 range (65504) come first, ties
        keep topological order.
    """
    inits = {t.name: t for t in model.graph.initializer}

    @functools.cache
    def peak(name: str) -> float:
        if name in summaries:
            return summaries[name].peak
        if name in inits:
            return summarize(onnx.numpy_helper.to_array(inits[name])).peak
        return 0.0

    score = {}
    for i in layers:
        node = model.graph.node[i]
        score[i] = max([peak(n) for n in list(node.output) + list(node.input) if n] or [0.0])
    return sorted(layers, key=lambda i: -score[i])  # stable: ties keep topological order
