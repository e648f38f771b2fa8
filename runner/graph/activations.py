"""Run a model once on ONNX Runtime and keep every intermediate tensor's value."""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from runner.errors import ModelError, first_line
from runner.graph.sessions import session_for
from runner.graph.weight_file import maps, weight_bytes, weight_file


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
    """A copy of ``model`` whose graph outputs are ``names`` (top-level tensors), in order; a large
    model's copy holds its weights in the weight file (``runner.graph.weight_file``), not in memory."""
    out = weight_file().mapped(model) if maps(weight_bytes(model)) else None
    if out is None:
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


def run_tensors_each(
    model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
) -> Iterator[Dict[str, np.ndarray]]:
    """``run_tensors`` for each of ``samples`` in turn, from one session: the values of ``names`` (top-level
    tensors), one sample at a time.

    Raises:
        ModelError: when ONNX Runtime cannot load or run the model.
    """
    names = list(dict.fromkeys(names))
    if not samples:
        return
    sess = session_for(marked(model, names), level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    for feeds in samples:
        try:
            values = sess.run(names, dict(feeds))
        except Exception as e:
            raise ModelError(f"ONNX Runtime cannot run the model: {first_line(e)}") from None
        yield {name: np.asarray(value) for name, value in zip(names, values)}


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
