"""Per-tensor summaries (dtype, shape, peak magnitude) of every tensor, in bounded memory.

The shape fallback needs only each tensor's dtype and shape, and precision's ranking only its
largest magnitude; holding every tensor's value at once would grow with the model. So ONNX
Runtime runs over chunks of tensors (each chunk marked as the graph's outputs), each chunk is
summarised and dropped, and the chunk size adapts so that one chunk's values stay under a
budget in bytes: the first chunk assumes tensors as large as the largest input (so an ordinary
model needs one run), later ones use the measured average.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Mapping, Tuple

import numpy as np
import onnx

from runner.graph.activations import run_tensors, top_level_outputs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSummary:
    """What a run says of one tensor without keeping its value.

    Attributes:
        dtype: the numpy dtype.
        shape: the concrete shape.
        peak: the largest finite absolute value for float tensors (inf when none is finite), 0.0
            for other or empty tensors.
    """

    dtype: np.dtype
    shape: Tuple[int, ...]
    peak: float


def summarize(value: np.ndarray) -> TensorSummary:
    """The summary of one value."""
    arr = np.asarray(value)
    peak = 0.0
    if arr.size and arr.dtype.kind == "f":
        finite = np.abs(arr[np.isfinite(arr)])
        peak = float(finite.max()) if finite.size else float("inf")
    return TensorSummary(arr.dtype, tuple(int(d) for d in arr.shape), peak)


def tensor_summaries(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], budget_bytes: int
) -> Dict[str, TensorSummary]:
    """Summaries of the graph inputs and every top-level node output, holding at most about
    ``budget_bytes`` of values at a time.

    Args:
        model: the model (not modified).
        feeds: a value for each graph input.
        budget_bytes: the size in bytes one chunk's values may take.

    Returns:
        ``{tensor name: TensorSummary}``.

    Raises:
        ModelError: when ONNX Runtime cannot load or run the model.
    """
    out = {name: summarize(value) for name, value in feeds.items()}
    names: List[str] = [n for n in top_level_outputs(model) if n not in out]
    first_guess = max((np.asarray(v).nbytes for v in feeds.values()), default=1)
    start, chunk, runs = 0, max(1, int(budget_bytes // max(first_guess, 1))), 0
    while start < len(names):
        part = names[start : start + chunk]
        values = run_tensors(model, feeds, part)
        used = sum(np.asarray(v).nbytes for v in values.values())
        out.update((name, summarize(value)) for name, value in values.items())
        del values
        start += len(part)
        runs += 1
        chunk = max(1, int(budget_bytes // max(used / len(part), 1)))
    log.debug("Summarised %d tensors in %d ONNX Runtime runs", len(out), runs)
    return out
