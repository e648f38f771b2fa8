"""A small model whose int8 quantization breaks at one node, and a data loader for it.

``outlier_model``: ``x -> Conv (one output channel biased by 1000) -> t -> Mul "scale" (that channel
times 0.001, the others times 10) -> Conv -> y``. Quantized per tensor, ``t``'s scale is set by the
outlier channel (a step of about 8), which rounds the other channels (values about 1) to 0 or 8;
``scale`` then multiplies that rounding by 10. Kept float, ``scale`` reads ``t`` unrounded and the
output is within a few percent: the one node to keep is ``scale``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LOADER = """
import numpy as np

def pages():
    rng = np.random.default_rng(0)
    for _ in range(4):
        yield {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}

def wrong_names():
    yield {"image": np.zeros((1, 3, 8, 8), np.float32)}
"""


def _image_model(nodes, name: str, inits, channels: int, opset: int) -> onnx.ModelProto:
    """A model from ``x`` [1, 3, 8, 8] to ``y`` [1, channels, 8, 8] at ``opset``."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def outlier_model(opset: int = 11) -> onnx.ModelProto:
    """The model of the module docstring, at ``opset`` (11: below what per-channel int8 needs)."""
    rng = np.random.default_rng(1)
    w1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = np.array([1000.0, 0.0, 0.0, 0.0], np.float32)
    s = np.array([0.001, 10.0, 10.0, 10.0], np.float32).reshape(1, 4, 1, 1)
    w2 = (rng.standard_normal((2, 4, 1, 1)) * 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (s, "s"), (w2, "w2"))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["t"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["t", "s"], ["u"], name="scale"),
        helper.make_node("Conv", ["u", "w2"], ["y"], name="conv2"),
    ]
    return _image_model(nodes, "outlier", inits, 2, opset)


def conv_outlier_model() -> onnx.ModelProto:
    """The outlier for TensorRT's placement, where pointwise nodes are not quantized: ``x -> conv1 (8
    channels, one biased by 1000) -> t -> conv2 (1x1: the outlier channel times 0.001, the others
    times 10) -> y``. conv2 reads ``t`` through one per-tensor scale set by the outlier (a step of
    about 8), which rounds the other channels to 0 or 8: the one node to keep is ``conv2``. Opset 13."""
    rng = np.random.default_rng(1)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = np.zeros(8, np.float32)
    b1[0] = 1000.0
    w2 = (rng.standard_normal((8, 8, 1, 1)) * 10).astype(np.float32)
    w2[:, 0] = 0.001
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["t"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["t", "w2"], ["y"], name="conv2"),
    ]
    return _image_model(nodes, "conv_outlier", inits, 8, 13)


def detector_int8(run, model, out, *extra):
    """The README's int8 run (``run``: the ``run`` fixture), ``extra`` overrides added: the detector at
    ``model`` on rendered pages, judged by the text map's IoU, its answer written to ``out``."""
    return run(
        "mode=precision",
        "low_precision=int8",
        "marker=minimal",
        f"model={model}",
        "data_loader=examples.text_pages.detector_pages",
        "checker=python",
        "checker.target=examples.text_pages.text_map_iou",
        f"checker.args=[{model}]",
        f"output={out}",
        *extra,
    )


def fp16_and_int8_model() -> onnx.ModelProto:
    """``conv_outlier_model`` followed by ``Div "shrink"`` by 1e5: int8 breaks at ``conv2`` (the outlier's
    shared scale), fp16 at ``shrink`` (its divisor past 65504 is clipped to it: the output 1.5x too large).
    The answer of ``low_precision=int8 quantization.float_precision=float16``: ``conv2`` out of int8 (in
    fp16), ``shrink`` in fp32. Opset 13."""
    model = conv_outlier_model()
    g = model.graph
    g.node[-1].output[0] = "z"
    g.initializer.append(numpy_helper.from_array(np.array(1e5, np.float32), "d"))
    g.node.append(helper.make_node("Div", ["z", "d"], ["y"], name="shrink"))
    return model


def dense_model(layers: int = 64, seed: int = 0, channels: int = 3) -> onnx.ModelProto:
    """``layers`` 1x1 Convs of ``channels`` channels (the first from the 3 of ``x``) in a chain, each
    near the identity with a spread of scales, so each one's int8 rounding adds a little error to the
    output: the needed set is dense (most nodes), with some nodes' error reaching the output far more
    than others'. TensorRT's placement quantizes Convs of 8 channels, not of 3."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        c_in = 3 if i == 0 else channels
        w = np.eye(channels, c_in) + 0.2 * rng.standard_normal((channels, c_in)) * rng.choice([0.1, 1.0, 3.0])
        inits.append(numpy_helper.from_array(w.reshape(channels, c_in, 1, 1).astype(np.float32), f"w{i}"))
        out = "y" if i == layers - 1 else f"t{i}"
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [out], name=f"conv{i}"))
        prev = out
    return _image_model(nodes, "dense", inits, channels, 13)


def integer_model() -> onnx.ModelProto:
    """A model with no float tensor: int64 Add."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"], name="add")],
        "ints",
        [helper.make_tensor_value_info("a", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("c", TensorProto.INT64, [4])],
        [numpy_helper.from_array(np.arange(4, dtype=np.int64), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def samples(count: int = 4) -> Iterator[Dict[str, np.ndarray]]:
    """The loader's samples, in this process."""
    rng = np.random.default_rng(0)
    for _ in range(count):
        yield {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}


def write_loader(directory: Path, name: str = "int8_feeds") -> str:
    """Write the data loader module into ``directory`` (to put on sys.path); its module name."""
    (directory / f"{name}.py").write_text(LOADER)
    return name


def calibration_reader(feeds: Iterable[Dict[str, np.ndarray]]) -> Any:
    """ONNX Runtime's ``CalibrationDataReader`` over ``feeds``, for ``quantize_static`` in a test (a QDQ
    model made as a user would make it)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self) -> Any:
            return next(self.it, None)

    return Reader()


def introduced_share(summary: Dict[str, Any], rows_path: Path) -> Tuple[float, List[Dict[str, str]]]:
    """The share of a layerwise run's nodes that got an introduced error (``layerwise.csv``'s
    ``intro_rel_l2``), and the CSV's rows; the CSV holds one row per node of the summary."""
    with open(rows_path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == summary["nodes"]
    return sum(1 for r in rows if r["intro_rel_l2"] != "") / len(rows), rows


def wide_model(channels: int = 24) -> onnx.ModelProto:
    """``x [1, 3, 8, 8] -> conv0 (3 to channels) -> conv1 -> conv2 -> conv3 -> y``, 1x1 Convs of ``channels``
    channels near the identity: TensorRT runs conv1..conv3 in fp8 (more than 16 channels each), not conv0
    (3 input channels). Opset 13."""
    rng = np.random.default_rng(2)
    inits, nodes, prev = [], [], "x"
    for i in range(4):
        c_in = 3 if i == 0 else channels
        w = np.eye(channels, c_in) + 0.1 * rng.standard_normal((channels, c_in))
        inits.append(numpy_helper.from_array(w.reshape(channels, c_in, 1, 1).astype(np.float32), f"w{i}"))
        out = "y" if i == 3 else f"t{i}"
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [out], name=f"conv{i}"))
        prev = out
    return _image_model(nodes, "wide", inits, channels, 13)
