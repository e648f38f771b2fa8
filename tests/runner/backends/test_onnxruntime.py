"""The ONNX Runtime backend in a parallel run: each check's GPU reaches the GPU providers as their
``device_id``; on CPU the slot's GPU changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.executors.slot import Slot, set_current
from tests.helpers.models import chain_model


def test_gpu_providers_get_the_slots_device_and_the_cpu_provider_is_left_alone():
    backend = OnnxRuntimeBackend(["CPUExecutionProvider"])
    assert backend.providers_for("1") == ["CPUExecutionProvider"]
    backend.providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert backend.providers_for("1") == [
        ("TensorrtExecutionProvider", {"device_id": "1"}),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        "CPUExecutionProvider",
    ]
    assert backend.providers_for(None) == backend.providers


def test_a_cpu_check_in_a_slot_with_a_gpu_runs_as_any_other():
    model = chain_model(3)
    feeds = {"x": np.ones((1, 4), np.float32)}
    backend = OnnxRuntimeBackend(["CPUExecutionProvider"])
    plain = backend.run(model, feeds, key="m")
    first = backend.session(model, "m")
    set_current(Slot(1, "3"))
    try:
        in_slot = backend.run(model, feeds, key="m")
        assert backend.session(model, "m") is first, "the CPU session is shared, not one per GPU"
    finally:
        set_current(None)
    assert all(np.array_equal(plain[n], in_slot[n]) for n in plain)


def test_make_backend_refuses_an_option_the_backend_does_not_take():
    """Issue 37: options a backend cannot use are an error, not dropped; ONNX Runtime's options reach
    only the backends that run on it."""
    from runner.backends.base import make_backend, onnxruntime_options
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match="onnx_reference takes no providers"):
        make_backend("onnx_reference", providers=["CPUExecutionProvider"])
    assert onnxruntime_options("onnx_reference", providers=["CPUExecutionProvider"]) == {}
    assert onnxruntime_options("fp16_emulation", graph_optimization_level="disable") == {
        "graph_optimization_level": "disable"
    }
    assert make_backend("fp16_emulation", **onnxruntime_options("fp16_emulation", providers=["CPUExecutionProvider"]))


def test_providers_for_checks_that_run_nowhere_on_onnxruntime_are_an_error():
    from runner.checkers.compare import CompareChecker
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match="do not run on ONNX Runtime"):
        CompareChecker.of(backend="onnx_reference", reference="onnx_reference", providers=["CUDAExecutionProvider"])
    assert CompareChecker.of(backend="onnx_reference", reference="onnxruntime", providers=["CPUExecutionProvider"])
