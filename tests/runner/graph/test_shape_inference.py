"""shape_inference=onnx|none|fallback (Polygraphy's --no-shape-inference, --force-fallback-shape-inference): where
reduce's subgraph boundaries get their types and shapes, on a model that declares a tensor's shape wrongly."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from runner.graph.meta import TensorMeta
from runner.graph.summaries import summarize
from tests.helpers.models import chain_model


def _declares_wrongly() -> onnx.ModelProto:
    """The 8-node chain ([1, 4] throughout) declaring its first tensor [1, 99]."""
    model = chain_model(8)
    first = model.graph.node[0].output[0]
    model.graph.value_info.append(helper.make_tensor_value_info(first, TensorProto.FLOAT, [1, 99]))
    return model


def _ran(model: onnx.ModelProto):
    """Summaries of one ONNX Runtime run of every tensor, counting the calls."""
    from runner.graph.activations import run_all_tensors

    calls = []

    def summaries():
        calls.append(1)
        values = run_all_tensors(model, {"x": np.ones((1, 4), np.float32)})
        return {name: summarize(value) for name, value in values.items()}

    return summaries, calls


def test_fallback_takes_every_shape_from_the_run_and_none_what_is_declared():
    model = _declares_wrongly()
    first = model.graph.node[0].output[0]
    summaries, calls = _ran(model)
    fallback = TensorMeta(model, {}, summaries, "fallback")
    assert calls == [1] and fallback.get(first)[1] == [1, 4], "the run's shape, not the declared one"
    assert all(fallback.get(o)[1] == [1, 4] for n in model.graph.node for o in n.output)
    summaries, calls = _ran(model)
    declared = TensorMeta(model, {}, summaries, "none")
    assert declared.get(first)[1] == [1, 99], "no inference: what the model declares"
    assert calls == [1] and declared.get(model.graph.node[1].output[0])[1] == [1, 4], "the run for the rest"
    summaries, calls = _ran(chain_model(8))
    inferred = TensorMeta(chain_model(8), {}, summaries, "onnx")
    assert calls == [] and inferred.get(first)[1] == [1, 4], "inference alone: no run"


def test_reduce_runs_with_each(run, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain_model(8), path)
    args = ["mode=reduce", f"model={path}", "checker=python", "checker.target=tests.helpers.crashing.check"]
    found = set()
    for how in ("onnx", "none", "fallback"):
        r = run(*args, f"shape_inference={how}", f"output={tmp_path / (how + '.onnx')}")
        assert r.returncode == 0, r.stderr[-2000:]
        found.add(tuple(n.name for n in onnx.load(tmp_path / (how + ".onnx")).graph.node))
    assert found == {("n3",)}
