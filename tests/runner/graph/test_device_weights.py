"""Weights kept on a device across sessions (``runner.graph.device_weights``), run here on the CPU provider:
the path is the CUDA provider's with the device named "cpu"."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from runner.graph import weight_file as wf
from runner.graph.device_weights import DeviceWeights, device_of
from runner.graph.sessions import session_file, session_for
from runner.lowp.convert import Converter
from tests.runner.graph.test_weight_file import _mlp

pytestmark = pytest.mark.usefixtures("small_maps")

X = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}


def _run(model: onnx.ModelProto, kept: DeviceWeights | None) -> np.ndarray:
    options = ort.SessionOptions()
    with session_file(model, options, kept) as source:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, X)[0])


def test_candidates_take_their_weights_from_the_device_each_copied_once_with_the_same_outputs():
    converter = Converter(_mlp())
    kept = DeviceWeights("cpu", 0)
    candidates = [converter.convert(k) for k in (["mm1", "mm2"], [], ["mm1"])]
    for model in candidates:
        np.testing.assert_array_equal(_run(model, kept), _run(model, None))
    fp32, fp16 = (64 * 128 + 128 * 16) * 4, (64 * 128 + 128 * 16) * 2
    assert kept.kept_bytes == fp32 + fp16, "each weight's fp32 and fp16 forms, once"
    assert kept.shared == 6
    for model in candidates:
        _run(model, kept)
    assert kept.kept_bytes == fp32 + fp16


def test_a_session_reads_the_kept_weights_not_the_file():
    """Once kept, a weight is not read from the weight file again: zeroing the file changes nothing for a
    session that takes the kept weights, and changes the outputs of one that does not."""
    model = wf.weight_file().mapped(_mlp())
    assert model is not None
    kept = DeviceWeights("cpu", 0)
    before = _run(model, kept)
    path = wf.weight_file().directory / wf.weight_file().name
    path.write_bytes(b"\0" * path.stat().st_size)
    np.testing.assert_array_equal(_run(model, kept), before)
    assert not np.array_equal(_run(model, None), before)


def test_weights_past_the_limit_are_read_from_the_file(caplog):
    import logging

    converter = Converter(_mlp())
    kept = DeviceWeights("cpu", 0, limit=64 * 128 * 4)  # w1's fp32 form fits, nothing more
    fp32, fp16 = converter.convert(["mm1", "mm2"]), converter.convert([])
    with caplog.at_level(logging.INFO, logger="runner.graph.device_weights"):
        for model in (fp32, fp16):
            np.testing.assert_array_equal(_run(model, kept), _run(model, None))
    assert kept.kept_bytes == 64 * 128 * 4 and kept.shared == 1
    assert caplog.text.count("(the limit); sessions read the rest from the weight file") == 1, "said once"


def test_only_the_cuda_providers_sessions_keep_weights_on_a_device():
    assert device_of(["CUDAExecutionProvider", "CPUExecutionProvider"]) == ("cuda", 0)
    assert device_of([("CUDAExecutionProvider", {"device_id": "1"})]) == ("cuda", 1)
    assert device_of(["CPUExecutionProvider"]) is None
    assert device_of(["TensorrtExecutionProvider", "CUDAExecutionProvider"]) is None
    assert device_of([]) is None
    model = _mlp()  # on the CPU provider a session maps the file instead: outputs as before
    np.testing.assert_array_equal(session_for(model).run(None, X)[0], _run(model, None))
