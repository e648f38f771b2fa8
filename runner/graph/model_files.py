"""The files a model is made of: the model file and the external data files its tensors reference."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional

if TYPE_CHECKING:  # imported once a model is read: a run of no model imports no ONNX
    import onnx


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for g in attr.graphs:
                yield from _tensors(g)


def external_locations(model: onnx.ModelProto) -> List[str]:
    """The external data files a model's tensors reference, as written (relative to the model file)."""
    import onnx

    found: List[str] = []
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = {e.key: e.value for e in tensor.external_data}.get("location")
            if location and location not in found:
                found.append(location)
    return found


def model_files(path: Optional[str | Path]) -> List[Path]:
    """The model file and the external data files it references (those that exist).

    Args:
        path: the model's path, or None.

    Returns:
        Absolute paths; empty when ``path`` is None or not a file. A file that is not ONNX yields
        only itself (loading it later gives the error).
    """
    if not path or not Path(path).is_file():
        return []
    import onnx

    from runner.graph.load import STREAM_BYTES
    from runner.graph.streamed import load_streamed

    path = Path(path).absolute()
    files = [path]
    try:
        model = (
            load_streamed(path)
            if path.stat().st_size >= STREAM_BYTES
            else onnx.load(str(path), load_external_data=False)
        )
    except Exception:  # not ONNX: load_model reports it
        return files
    for location in external_locations(model):
        data = path.parent / location
        if data.is_file() and data not in files:
            files.append(data)
    return files
