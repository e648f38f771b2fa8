"""mode=reduce through the real CLI, on graphs built here and on the real models in ../shared/models."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.helpers.checks import python_check
from tests.helpers.cli import check_cmd
from tests.helpers.models import CLASSIFIER, DETECTOR, VAD, VAD_IF, branchy_model, chain_model, f32, make_model, need


def _names(path):
    return [n.name for n in onnx.load(str(path)).graph.node]


def _compute_names(path):
    return [n.name for n in onnx.load(str(path)).graph.node if n.op_type != "Constant"]


def _reduce(run, model_path, culprits, *extra, out=None, script=None):
    """Reduce with a check that fails while the model holds every culprit: in-process (checker=python),
    or the command ``script`` when given."""
    out = out or model_path.parent / "reduced.onnx"
    check = [check_cmd(script, "{artifact}", *culprits)] if script else python_check(*culprits)
    r = run("mode=reduce", f"model={model_path}", *check, f"output={out}", *extra)
    assert r.returncode == 0, r.stderr + r.stdout[-3000:]
    onnx.checker.check_model(str(out))
    return r, out


@pytest.mark.parametrize("marker", ["bisect", "linear"])
@pytest.mark.parametrize("culprit", ["n0", "n3", "n7"])
def test_single_node_fault_in_a_chain(run, tmp_path, has_nodes_script, marker, culprit):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    r, out = _reduce(run, model, [culprit], f"marker={marker}")
    assert _compute_names(out) == [culprit]
    s = r.summary
    assert s["nodes_before"] == 9 and s["compute_nodes_after"] == 1 and s["output"] == str(out)
    # the user's file, the whole model as extracted, the round's search, the probe; plus one control
    # check when no search candidate passed (a culprit first in topological order)
    control = 1 if culprit == "n0" else 0
    answer = 1  # the written answer's own check
    assert s["checks"] <= (2 + math.ceil(math.log2(8)) + 1 if marker == "bisect" else 2 + 8 + 1) + control + answer
    assert onnx.load(str(out)).opset_import[0].version == 17


@pytest.mark.parametrize("marker", ["bisect", "linear"])
@pytest.mark.slow
def test_two_node_fault_on_different_branches(run, tmp_path, has_nodes_script, marker):
    model = tmp_path / "branchy.onnx"
    onnx.save(branchy_model(), model)
    # the command check once (bisect); the in-process one for linear's many checks
    script = has_nodes_script if marker == "bisect" else None
    _r, out = _reduce(run, model, ["a1", "b1"], f"marker={marker}", script=script)
    assert sorted(_compute_names(out)) == ["a1", "b1"]
    reduced = onnx.load(str(out))
    assert {i.name for i in reduced.graph.input} == {"a0o", "b0o"}
    assert [i.name for i in reduced.graph.initializer] == ["w"], "initializers stay initializers"


def test_fault_at_a_second_graph_output(run, tmp_path, has_nodes_script):
    model = tmp_path / "branchy.onnx"
    onnx.save(branchy_model(), model)
    _r, out = _reduce(run, model, ["side_out"])
    reduced = onnx.load(str(out))
    assert _compute_names(out) == ["side_out"]
    assert [o.name for o in reduced.graph.output] == ["side"]
    assert [i.name for i in reduced.graph.input] == ["b2o"]
    vi = reduced.graph.input[0].type.tensor_type
    assert vi.elem_type == TensorProto.FLOAT and [d.dim_value for d in vi.shape.dim] == [1, 4]


def test_reduce_inputs_off_keeps_graph_inputs(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    _r, out = _reduce(run, model, ["n3"], "reduce_inputs=false")
    assert _compute_names(out) == ["n0", "n1", "n2", "n3"]
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["x"]


def test_reduce_outputs_off_keeps_graph_outputs(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    _r, out = _reduce(run, model, ["n3"], "reduce_outputs=false")
    assert _compute_names(out) == ["n3", "n4", "n5", "n6", "n7"]
    assert [o.name for o in onnx.load(str(out)).graph.output] == ["y"]


def test_dynamic_shapes_become_concrete_at_boundaries(run, tmp_path, has_nodes_script):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], name="tr", perm=[1, 0]),
        helper.make_node("Sigmoid", ["t"], ["y"], name="sig"),
    ]
    model = tmp_path / "dyn.onnx"
    onnx.save(make_model(nodes, [f32("x", ["N", 4])], [f32("y", [4, "N"])]), model)
    _r, out = _reduce(run, model, ["tr"], "model_input_shapes={x:[3,4]}")
    reduced = onnx.load(str(out))

    def dims(vi):
        return [d.dim_value for d in vi.type.tensor_type.shape.dim]

    assert dims(reduced.graph.input[0]) == [3, 4] and dims(reduced.graph.output[0]) == [4, 3]
    sess = ort.InferenceSession(reduced.SerializeToString())
    assert sess.run(None, {"r": np.ones((3, 4), np.float32)})[0].shape == (4, 3)


def test_min_good_is_written(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    good = tmp_path / "good.onnx"
    r, _out = _reduce(run, model, ["n5"], f"min_good={good}")
    assert r.summary["min_good"] == str(good)
    assert "n5" not in _names(good) and len(_compute_names(good)) >= 1
    onnx.checker.check_model(str(good))


def test_constant_nodes_become_initializers_unless_kept(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(6), model)
    _, out = _reduce(run, model, ["n3"])
    reduced = onnx.load(str(out))
    assert [n.name for n in reduced.graph.node] == ["n3"] and [i.name for i in reduced.graph.initializer] == ["c"]
    r, kept = _reduce(run, model, ["n3"], "keep_constant_nodes=true", out=tmp_path / "kept.onnx")
    assert _names(kept) == ["const", "n3"] and r.summary["nodes_after"] == 2


def test_metadata_and_names_are_kept(run, tmp_path, has_nodes_script):
    m = chain_model(6)
    m.producer_name = "unit-test"
    helper.set_model_props(m, {"owner": "me"})
    model = tmp_path / "chain.onnx"
    onnx.save(m, model)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    _, out = _reduce(run, model, ["n2"])
    reduced = onnx.load(str(out))
    assert reduced.producer_name == "unit-test"
    assert {p.key: p.value for p in reduced.metadata_props} == {"owner": "me"}
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before, "the input file is never modified"


def test_external_data_round_trip(run, tmp_path, has_nodes_script):
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).random((64, 64), dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("MatMul", ["b", "w"], ["y"], name="mm2"),
    ]
    m = make_model(nodes, [f32("x", [1, 64])], [f32("y", [1, 64])], [w])
    model = tmp_path / "ext.onnx"
    onnx.save_model(m, str(model), save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    assert (tmp_path / "ext.onnx.data").stat().st_size == 64 * 64 * 4
    out = tmp_path / "out" / "reduced.onnx"
    out.parent.mkdir()
    _r, _ = _reduce(run, model, ["mm2"], "external_data=true", "external_data_threshold=16", out=out)
    assert (out.parent / "reduced.onnx.data").stat().st_size >= 64 * 64 * 4
    loaded = onnx.load(str(out))
    assert _compute_names(out) == ["mm2"] and onnx.numpy_helper.to_array(loaded.graph.initializer[0]).shape == (64, 64)


# ---- real models ---------------------------------------------------------------------------


@pytest.mark.slow
def test_detector_bisect_beats_polygraphy(run, tmp_path, has_nodes_script):
    model = need(DETECTOR)
    r, out = _reduce(
        run,
        model,
        ["p2o.Conv.31"],
        "marker=bisect",
        "model_input_shapes={x:[1,3,160,160]}",
        out=tmp_path / "det.onnx",
        script=has_nodes_script,
    )
    s = r.summary
    assert _compute_names(out) == ["p2o.Conv.31"]
    assert s["checks"] <= 15, "within 1.5x of ceil(log2 672) = 10"
    assert s["checks"] <= 17, "never more than Polygraphy's 17"
    assert s["nodes_before"] == 672
    assert s["nodes_after"] == 1, "no larger than Polygraphy's 1-node result: the weights are initializers"


@pytest.mark.slow
def test_detector_linear_half_of_polygraphy(run, tmp_path, has_nodes_script):
    model = need(DETECTOR)
    r, out = _reduce(
        run, model, ["p2o.Conv.31"], "marker=linear", "model_input_shapes={x:[1,3,160,160]}", out=tmp_path / "det.onnx"
    )
    assert _compute_names(out) == ["p2o.Conv.31"]
    assert r.summary["checks"] <= 555 // 2
    entries = r.replay["iterations"]
    assert len({e["key"] for e in entries}) == len(entries), "no candidate checked twice"


def test_classifier_two_node_fault(run, tmp_path, has_nodes_script):
    model = need(CLASSIFIER)
    names = [n.name for n in onnx.load(str(model)).graph.node if n.op_type == "Conv"]
    a, b = names[3], names[-2]
    _r, out = _reduce(run, model, [a, b], "model_input_shapes={x:[1,3,48,192]}", out=tmp_path / "cls.onnx")
    assert sorted(_compute_names(out)) == sorted([a, b])
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
    _r, out = _reduce(
        run,
        model,
        [target],
        f"inputs={inputs}",
        "model_input_shapes={input:[1,512],state:[2,1,128]}",
        out=tmp_path / "vad.onnx",
    )
    assert _compute_names(out) == [target]


def test_if_node_moves_as_one(run, tmp_path, has_nodes_script):
    model = need(VAD_IF)
    inputs = _vad_inputs(tmp_path)
    _r, out = _reduce(
        run,
        model,
        ["If_0"],
        f"inputs={inputs}",
        "model_input_shapes={input:[1,512],state:[2,1,128]}",
        out=tmp_path / "if.onnx",
    )
    reduced = onnx.load(str(out))
    assert _compute_names(out) == ["If_0"]
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


def test_keep_intermediate_and_sorted_iteration_models(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    art = tmp_path / "art"
    it = tmp_path / "candidate.onnx"
    r, _ = _reduce(
        run,
        model,
        ["n4"],
        "artifacts.keep_intermediate=true",
        f"artifacts.dir={art}",
        f"artifacts.iter_artifact={it}",
        f"artifacts.paths=[{it}]",
    )
    checks = r.summary["checks"]
    kept = sorted((art / "intermediate").iterdir())
    assert len(kept) == checks and all(p.name.startswith("candidate_iter") and p.suffix == ".onnx" for p in kept)
    good, bad = list((art / "good").iterdir()), list((art / "bad").iterdir())
    assert len(good) + len(bad) == checks
    assert all("n4" in _names(p) for p in bad) and all("n4" not in _names(p) for p in good)


def _three(output_shape):
    """n0 -> n1 -> n2 (Relu, Neg, Abs) on a [1, 4] input, the output declared with ``output_shape`` (None: none)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="n0"),
        helper.make_node("Neg", ["a"], ["b"], name="n1"),
        helper.make_node("Abs", ["b"], ["Y"], name="n2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, output_shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _dims(value_info):
    return [d.dim_value or d.dim_param for d in value_info.type.tensor_type.shape.dim]


def test_an_output_declared_without_a_shape_gets_one_and_the_run_ends_with_its_answer(run, tmp_path):
    """The model loads in ONNX Runtime though onnx.checker wants a shape: that problem is the model's, so
    candidates are not blamed for it, and the reduced model declares a concrete shape and passes the checker."""
    path = tmp_path / "noshape.onnx"
    onnx.save(_three(None), path)
    r = run("mode=reduce", f"model={path}", *python_check("n1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["n1"]
    reduced = onnx.load(r.summary["output"])
    onnx.checker.check_model(reduced)
    assert [_dims(o) for o in reduced.graph.output] == [[1, 4]]


def test_a_model_of_constants_only_reduces_to_the_failing_node_with_its_input_as_an_initializer(run, tmp_path):
    """Polygraphy's scenario: Constant -> Identity -> node_3 -> node_5 and no graph input, failing while node_3
    is present. Its answer is node_3 with the constant as an initializer; it runs as written."""
    from onnx import TensorProto, helper, numpy_helper

    value = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4))
    nodes = [
        helper.make_node("Constant", [], ["c"], value=value, name="node_1"),
        helper.make_node("Identity", ["c"], ["i"], name="node_2"),
        helper.make_node("Relu", ["i"], ["r"], name="node_3"),
        helper.make_node("Neg", ["r"], ["y"], name="node_5"),
    ]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "constants.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    r = run("mode=reduce", f"model={path}", *python_check("node_3"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["node_3"]
    reduced = onnx.load(r.summary["output"])
    assert not reduced.graph.input and [t.name for t in reduced.graph.initializer] == ["i"]
    (out,) = ort.InferenceSession(reduced.SerializeToString()).run(None, {})
    np.testing.assert_array_equal(out, [[0, 1, 2, 3]])


def test_symbolic_dims_become_the_shapes_the_user_gave(run, tmp_path):
    """Polygraphy's dynamic-input scenario: X is (1, 2, 'height', 'width'); with model_input_shapes the reduced
    model's own input (and the boundary output) are declared [1, 2, 5, 5], not symbolic."""
    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="r0"),
        helper.make_node("Neg", ["a"], ["b"], name="n1"),
        helper.make_node("Abs", ["b"], ["Y"], name="a2"),
    ]
    dims = [1, 2, "height", "width"]
    model = tmp_path / "dynamic.onnx"
    onnx.save(make_model(nodes, [f32("X", dims)], [f32("Y", dims)], []), model)
    for culprit in ("r0", "a2"):
        _r, out = _reduce(run, model, [culprit], "model_input_shapes={X:[1,2,5,5]}", out=tmp_path / f"{culprit}.onnx")
        reduced = onnx.load(str(out))
        assert _compute_names(out) == [culprit]
        for vi in list(reduced.graph.input) + list(reduced.graph.output):
            assert [d.dim_value for d in vi.type.tensor_type.shape.dim] == [1, 2, 5, 5], vi.name


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
