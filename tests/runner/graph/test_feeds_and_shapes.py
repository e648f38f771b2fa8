"""Inputs (generated or loaded), input-shape validation, shape inference with the ONNX Runtime fallback, load/save."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.errors import ArtifactError, ConfigError, ModelError
from runner.graph.feeds import check_input_shapes, generate_feeds, input_specs, load_npz, model_feeds
from runner.graph.load import check_saved, load_model, save_model
from runner.graph.meta import TensorMeta
from tests.helpers.models import CLASSIFIER, chain_model, need


def _dynamic():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_input_specs_fill_dynamic_dims():
    assert input_specs(_dynamic()) == [("x", np.dtype(np.float32), [1, 4])]
    assert input_specs(_dynamic(), {"x": [3, 4]})[0][2] == [3, 4]


@pytest.mark.parametrize(
    "shapes, words",
    [
        ({"y": [1, 4]}, "not a model input"),
        ({"x": [1]}, "rank"),
        ({"x": [-1, 4]}, "negative"),
        ({"x": ["a", 4]}, "integers"),
        ([1, 2], "not a mapping"),
    ],
)
def test_bad_input_shapes(shapes, words):
    with pytest.raises(ConfigError, match=words):
        check_input_shapes(_dynamic(), shapes)


def test_generated_feeds_are_deterministic():
    specs = [("x", np.dtype(np.float32), [2, 3]), ("i", np.dtype(np.int64), [2]), ("b", np.dtype(np.bool_), [1])]
    a, b = generate_feeds(specs, 7), generate_feeds(specs, 7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert a["x"].dtype == np.float32 and a["i"].dtype == np.int64 and a["b"].dtype == np.bool_
    assert not np.array_equal(a["x"], generate_feeds(specs, 8)["x"])


def test_loaded_feeds_must_hold_every_input(tmp_path):
    np.savez(tmp_path / "f.npz", other=np.ones(1))
    with pytest.raises(ConfigError, match="lacks model inputs"):
        model_feeds(_dynamic(), None, str(tmp_path / "f.npz"), 0)
    np.savez(tmp_path / "g.npz", x=np.ones((2, 4), np.float32))
    assert model_feeds(_dynamic(), None, str(tmp_path / "g.npz"), 0)["x"].shape == (2, 4)


def test_load_npz_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_npz(tmp_path / "nope.npz", "inputs")
    with pytest.raises(ConfigError, match=r"inputs=.* is a directory; give an \.npz file"):
        load_npz(tmp_path, "inputs")
    np.save(tmp_path / "a.npy", np.ones(2))
    with pytest.raises(ConfigError, match=r"\.npy"):
        load_npz(tmp_path / "a.npy", "inputs")


def test_shapes_from_inference_need_no_run():
    calls = []
    meta = TensorMeta(chain_model(3), {}, lambda: calls.append(1) or {})
    assert meta.get("t1") == (np.dtype(np.float32), [1, 4]) and not calls


def test_shapes_missing_after_inference_come_from_one_run():
    model = onnx.load(str(need(CLASSIFIER)))
    calls = []

    def values():
        from runner.graph.feeds import model_feeds
        from runner.graph.summaries import tensor_summaries

        calls.append(1)
        return tensor_summaries(model, model_feeds(model, {"x": [1, 3, 48, 192]}, None, 0), 2**30)

    meta = TensorMeta(model, {"x": [1, 3, 48, 192]}, values)
    assert calls == [1]
    assert all(meta.get(o) is not None for n in model.graph.node for o in n.output if o)


def test_fallback_error_is_kept():
    def fails():
        raise ModelError("no kernel")

    model = _dynamic()
    model.graph.node[0].op_type = "NoSuchOp"
    meta = TensorMeta(model, {}, fails)
    assert meta.fallback_error == "no kernel" and meta.get("y") is None


def test_save_and_load_with_external_data(tmp_path):
    model = chain_model(2)
    model.graph.initializer.append(numpy_helper.from_array(np.arange(64, dtype=np.float32), "w"))
    path = save_model(model, tmp_path / "m.onnx", external_data=True, threshold=16)
    assert (tmp_path / "m.onnx.data").stat().st_size >= 256
    check_saved(path)
    loaded = load_model(path)
    assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), np.arange(64, dtype=np.float32))
    # the model in memory keeps its tensors: an in-process checker runs it after it is written
    assert np.array_equal(numpy_helper.to_array(model.graph.initializer[0]), np.arange(64, dtype=np.float32))


def test_load_errors(tmp_path):
    with pytest.raises(ModelError, match="no model given"):
        load_model(None)
    (tmp_path / "x.onnx").write_text("not a model")
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(tmp_path / "x.onnx")
    with pytest.raises(ArtifactError):
        save_model(chain_model(1), tmp_path / "x.onnx" / "sub.onnx")


def test_summaries_in_small_chunks_equal_one_full_run():
    from runner.graph.activations import run_all_tensors
    from runner.graph.summaries import summarize, tensor_summaries

    model = onnx.load(str(need(CLASSIFIER)))
    feeds = model_feeds(model, {"x": [1, 3, 48, 192]}, None, 0)
    full = {name: summarize(value) for name, value in run_all_tensors(model, feeds).items()}
    chunked = tensor_summaries(model, feeds, budget_bytes=64 * 1024)  # a few tensors per run
    assert chunked == full


def test_summary_peak():
    from runner.graph.summaries import summarize

    assert summarize(np.array([1.0, -7.0, np.inf], np.float32)).peak == 7.0
    assert summarize(np.array([np.inf], np.float32)).peak == float("inf")
    assert summarize(np.array([5], np.int64)).peak == 0.0
