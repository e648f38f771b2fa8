"""Polygraphy's options added as keys, through the Python API as on the command line: one reduce taking the logging,
loading, writing and marker keys at once, and a layerwise leaving out an intermediate tensor."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from runner import api
from tests.helpers.models import f32, make_model


def _nan_after_weights(tmp_path):
    """x -> MatMul by a 32x32 weight (4 KiB) -> Neg -> Sqrt (NaN) -> Abs -> y: "root" makes the NaN."""
    w = onnx.numpy_helper.from_array(np.eye(32, dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Sqrt", ["b"], ["c"], name="root"),
        helper.make_node("Abs", ["c"], ["y"], name="abs"),
    ]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [f32("x", [1, 32])], [f32("y", [1, 32])], [w]), path)
    return path


def test_one_reduce_with_the_new_keys(tmp_path):
    model = _nan_after_weights(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    r = api.reduce(
        model,
        "validate",
        val_range=[1, 2],
        marker="auto",
        shape_inference="fallback",
        verbosity=["strategies/onnx_search.py:debug"],
        log_format=["line-info"],
        log_file=str(tmp_path / "run.log"),
        output=str(out / "r.onnx"),
        external_data_path="w.bin",
        external_data_threshold="1K",
        run_dir=tmp_path / "run",
    )
    assert r.ok, r.summary["status"]
    assert [n.name for n in onnx.load(str(out / "r.onnx"), load_external_data=False).graph.node] == ["root"]
    text = (tmp_path / "run.log").read_text()
    assert "marker=auto: linear" in text and "[strategies.onnx_search][DEBUG][onnx_search.py:" in text
    assert "tensors from ONNX Runtime's run (shape_inference=fallback)" in text


def test_a_reduce_keeping_weights_writes_them_to_the_named_file(tmp_path):
    model = _nan_after_weights(tmp_path)
    r = api.reduce(
        model,
        lambda path: all(n.name != "mm" for n in onnx.load(path, load_external_data=False).graph.node),
        output=str(tmp_path / "r.onnx"),
        external_data_path="w.bin",
        external_data_threshold="1K",
        run_dir=tmp_path / "run",
    )
    assert r.ok, r.summary["status"]
    assert (tmp_path / "w.bin").stat().st_size == 32 * 32 * 4
