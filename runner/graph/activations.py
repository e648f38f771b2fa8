"""Run a model once on ONNX Runtime and keep every intermediate tensor's value."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from runner.errors import ModelError, first_line
from runner.graph.load import as_file, is_large


def session_for(
    model: onnx.ModelProto,
    providers: Sequence[Any] = ("CPUExecutionProvider",),
    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
) -> ort.InferenceSession:
    """An ONNX Runtime session for an in-memory model (through a temp file past 2 GB).

    ``providers``: names, or ``(name, options)`` pairs (e.g. ``("CUDAExecutionProvider", {"device_id": "1"})``).

    Raises:
        ModelError: when ONNX Runtime rejects the model.
    """
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    try:
        if is_large(model):
            with as_file(model) as path:
                return ort.InferenceSession(str(path), opts, providers=list(providers))
        return ort.InferenceSession(model.SerializeToString(), opts, providers=list(providers))
    except Exception as e:  # onnxruntime raises its own exception types
        raise ModelError(f"ONNX Runtime cannot load the model: {first_line(e)}") from None


def top_level_outputs(model: onnx.ModelProto) -> List[str]:
    """The names of every top-level node output, in node order, each once."""
    names: List[str] = []
    seen = set()
    for node in model.graph.node:
        for name in node.output:
            if name and name not in seen:
                seen.add(name)
                names.append(name)
    return names


def marked(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph outputs are ``names`` (top-level tensors), in order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names))
    return out


def run_tensors(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> Dict[str, np.ndarray]:
    """The values of the tensors ``names`` (top-level node outputs) from one CPU run with those, and
    only those, marked as the graph's outputs (ONNX Runtime computes what they need).

    Raises:
        ModelError: when ONNX Runtime cannot load or run the model.
    """
    sess = session_for(marked(model, names), level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    try:
        values = sess.run(list(names), dict(feeds))
    except Exception as e:
        raise ModelError(f"ONNX Runtime cannot run the model: {first_line(e)}") from None
    return {name: np.asarray(value) for name, value in zip(names, values)}


def run_all_tensors(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Values of the graph inputs and of every top-level node output, from one CPU run.

    Graph optimizations are off so that every tensor exists as in the model. The values of
    tensors inside If/Loop/Scan bodies are not returned. Memory grows with the model's tensors;
    ``runner.graph.summaries`` keeps only summaries, in chunks.

    Args:
        model: the model (not modified).
        feeds: a value for each graph input.

    Returns:
        ``{tensor name: value}`` for the inputs and every node output name.

    Raises:
        ModelError: when ONNX Runtime cannot load or run the model.
    """
    names = list(dict.fromkeys([o.name for o in model.graph.output] + top_level_outputs(model)))
    out = {k: np.asarray(v) for k, v in feeds.items()}
    out.update(run_tensors(model, feeds, names))
    return out
