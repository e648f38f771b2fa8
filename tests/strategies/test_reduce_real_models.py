"""mode=reduce through the real CLI on the real models in ../shared/models: the detector against
Polygraphy's check counts, the classifier, the recurrent and If models, and faults planted in real
exports judged against golden values."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers.checks import compute_names, reduce_run
from tests.helpers.models import CLASSIFIER, DETECTOR, VAD, VAD_IF, need


@pytest.mark.slow
def test_detector_bisect_beats_polygraphy(run, tmp_path, has_nodes_script):
    model = need(DETECTOR)
    r, out = reduce_run(
        run,
        model,
        ["p2o.Conv.31"],
        "marker=bisect",
        "model_input_shapes={x:[1,3,160,160]}",
        out=tmp_path / "det.onnx",
        script=has_nodes_script,
    )
    s = r.summary
    assert compute_names(out) == ["p2o.Conv.31"]
    assert s["checks"] <= 15, "within 1.5x of ceil(log2 672) = 10"
    assert s["checks"] <= 17, "never more than Polygraphy's 17"
    assert s["nodes_before"] == 672
    assert s["nodes_after"] == 1, "no larger than Polygraphy's 1-node result: the weights are initializers"


@pytest.mark.slow
def test_detector_linear_half_of_polygraphy(run, tmp_path, has_nodes_script):
    model = need(DETECTOR)
    r, out = reduce_run(
        run, model, ["p2o.Conv.31"], "marker=linear", "model_input_shapes={x:[1,3,160,160]}", out=tmp_path / "det.onnx"
    )
    assert compute_names(out) == ["p2o.Conv.31"]
    assert r.summary["checks"] <= 555 // 2
    entries = r.replay["iterations"]
    assert len({e["key"] for e in entries}) == len(entries), "no candidate checked twice"


def test_classifier_two_node_fault(run, tmp_path, has_nodes_script):
    model = need(CLASSIFIER)
    names = [n.name for n in onnx.load(str(model)).graph.node if n.op_type == "Conv"]
    a, b = names[3], names[-2]
    _r, out = reduce_run(run, model, [a, b], "model_input_shapes={x:[1,3,48,192]}", out=tmp_path / "cls.onnx")
    assert sorted(compute_names(out)) == sorted([a, b])
    sess = ort.InferenceSession(str(out))
    feeds = {i.name: np.random.rand(*i.shape).astype(np.float32) for i in sess.get_inputs()}
    sess.run(None, feeds)


def _vad_inputs(tmp_path):
    """Half a second of noise at 16 kHz, a zero state and the sample rate, for the voice-activity models."""
    inputs = tmp_path / "vad_inputs.npz"
    np.savez(
        inputs,
        input=np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32),
        state=np.zeros((2, 1, 128), np.float32),
        sr=np.array(16000, np.int64),
    )
    return inputs


def test_recurrent_model_with_int_inputs(run, tmp_path, has_nodes_script):
    model = need(VAD)
    m = onnx.load(str(model))
    target = [n.name for n in m.graph.node if n.op_type == "Conv"][2]
    inputs = _vad_inputs(tmp_path)
    _r, out = reduce_run(
        run,
        model,
        [target],
        f"inputs={inputs}",
        "model_input_shapes={input:[1,512],state:[2,1,128]}",
        out=tmp_path / "vad.onnx",
    )
    assert compute_names(out) == [target]


def test_if_node_moves_as_one(run, tmp_path, has_nodes_script):
    model = need(VAD_IF)
    inputs = _vad_inputs(tmp_path)
    _r, out = reduce_run(
        run,
        model,
        ["If_0"],
        f"inputs={inputs}",
        "model_input_shapes={input:[1,512],state:[2,1,128]}",
        out=tmp_path / "if.onnx",
    )
    reduced = onnx.load(str(out))
    assert compute_names(out) == ["If_0"]
    assert {i.name for i in reduced.graph.input} == {"Equal_0_C", "input", "state"}, "outer-scope reads become inputs"
    sess = ort.InferenceSession(str(out))
    got = sess.run(
        None,
        {
            "Equal_0_C": np.array(True),
            "input": np.zeros((1, 512), np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
        },
    )
    assert len(got) == 2


@pytest.mark.slow
def test_a_planted_fault_in_a_deep_layer_is_found_above_the_fp32_noise_floor(run, tmp_path):
    """Issue 38: bert_tiny with layer 2's query weight scaled by -3, judged against the original's golden values
    at the default atol = rtol = 1e-3: subgraphs of layer 1 differ from the golden values by fp32 re-association
    noise (max abs 0.086 on values near 2e5), which blamed 8 nodes of layer 1 in 67 checks. Failures within the
    reference's own noise now pass (a second run in another reduction order), and the answer is the planted node,
    tested 1-minimal."""
    from onnx import numpy_helper

    from tests.helpers.models import MODELS

    path = need(MODELS / "zoo" / "bert_tiny.onnx")
    model = onnx.load(str(path))
    query = next(n for n in model.graph.node if n.name == "/m/encoder/layer.2/attention/self/query/MatMul")
    weight = next(i for i in model.graph.initializer if i.name == query.input[1])
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(-3), weight.name))
    bad, inputs, golden = tmp_path / "bert_bad.onnx", tmp_path / "in.npz", tmp_path / "golden.npz"
    onnx.save(model, bad)
    np.savez(inputs, **dict(np.load(path.with_suffix(".npz"))))
    saved = run(
        "mode=repeat", "until=1", f"model={path}", "checker=compare", f"inputs={inputs}", f"save_golden={golden}"
    )
    assert saved.returncode == 0, saved.stderr[-2000:]
    r = run("mode=reduce", f"model={bad}", "checker=compare", f"golden={golden}", f"inputs={inputs}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == [query.name]
    assert r.summary["checks"] <= 30


@pytest.mark.slow
def test_a_perturbed_conv_is_found_alone_against_golden_values(run, tmp_path):
    """Issue 35: one Conv's weight scaled 1.5x (the recognizer's p2o.Conv.33 there; the classifier's Conv@33
    here), reduce judged against the original's golden values: the answer is that node alone, as Polygraphy
    finds it (the answer is tested 1-minimal; it held 2 nodes before)."""
    from examples.text_pages import classifier_lines
    from tests.helpers.models import CLASSIFIER, perturbed_classifier

    path = need(CLASSIFIER)
    model, conv = perturbed_classifier()
    bad, inputs, golden = tmp_path / "bad.onnx", tmp_path / "x.npz", tmp_path / "golden.npz"
    onnx.save(model, bad)
    np.savez(inputs, **next(iter(classifier_lines(1))))
    saved = run(
        "mode=repeat", "until=1", f"model={path}", "checker=compare", f"inputs={inputs}", f"save_golden={golden}"
    )
    assert saved.returncode == 0, saved.stderr[-2000:]
    tight = ["checker.atol=1e-5", "checker.rtol=1e-4"]
    r = run("mode=reduce", f"model={bad}", "checker=compare", f"golden={golden}", f"inputs={inputs}", *tight)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == [conv]
