"""Run a model once on ONNX Runtime and keep every intermediate tensor's value."""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from runner.errors import ModelError
from runner.graph.load import as_file, is_large


def session_for(
    model: onnx.ModelProto,
    providers: Sequence[str] = ("CPUExecutionProvider",),
    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
) -> ort.InferenceSession:
    """An ONNX Runtime session for an in-memory model (through a temp file past 2 GB).

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
        raise ModelError(f"ONNX Runtime cannot load the model: {str(e).strip().splitlines()[0]}") from None


def run_all_tensors(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Values of the graph inputs and of every top-level node output, from one CPU run.

    Graph optimizations are off so that every tensor exists as in the model. The values of
    tensors inside If/Loop/Scan bodies are not returned.

    Args:
        model: the model (not modified).
        feeds: a value for each graph input.

    Returns:
        ``{tensor name: value}`` for the inputs and every node output name.

    Raises:
        ModelError: when ONNX Runtime cannot load or run the model.
    """
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    known = {o.name for o in marked.graph.output}
    for node in marked.graph.node:
        for name in node.output:
            if name and name not in known:
                marked.graph.output.append(onnx.ValueInfoProto(name=name))
                known.add(name)
    sess = session_for(marked, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds))
    except Exception as e:
        raise ModelError(f"ONNX Runtime cannot run the model: {str(e).strip().splitlines()[0]}") from None
    out = {k: np.asarray(v) for k, v in feeds.items()}
    out.update(zip(names, values))
    return out
