"""mode=reduce through the real CLI, on graphs built here and on the real models in ../shared/models."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.helpers.checks import compute_names, python_check, reduce_args, reduce_run
from tests.helpers.cli import one_line_error
from tests.helpers.models import branchy_model, chain_model, f32, make_model


def _names(path):
    return [n.name for n in onnx.load(str(path)).graph.node]


@pytest.mark.parametrize("marker", ["bisect", "linear"])
@pytest.mark.parametrize("culprit", ["n0", "n3", "n7"])
def test_single_node_fault_in_a_chain(run, tmp_path, has_nodes_script, marker, culprit):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    r, out = reduce_run(run, model, [culprit], f"marker={marker}")
    assert compute_names(out) == [culprit]
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
    _r, out = reduce_run(run, model, ["a1", "b1"], f"marker={marker}", script=script)
    assert sorted(compute_names(out)) == ["a1", "b1"]
    reduced = onnx.load(str(out))
    assert {i.name for i in reduced.graph.input} == {"a0o", "b0o"}
    assert [i.name for i in reduced.graph.initializer] == ["w"], "initializers stay initializers"


def test_fault_at_a_second_graph_output(run, tmp_path, has_nodes_script):
    model = tmp_path / "branchy.onnx"
    onnx.save(branchy_model(), model)
    _r, out = reduce_run(run, model, ["side_out"])
    reduced = onnx.load(str(out))
    assert compute_names(out) == ["side_out"]
    assert [o.name for o in reduced.graph.output] == ["side"]
    assert [i.name for i in reduced.graph.input] == ["b2o"]
    vi = reduced.graph.input[0].type.tensor_type
    assert vi.elem_type == TensorProto.FLOAT and [d.dim_value for d in vi.shape.dim] == [1, 4]


def test_reduce_inputs_off_keeps_graph_inputs(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    _r, out = reduce_run(run, model, ["n3"], "reduce_inputs=false")
    assert compute_names(out) == ["n0", "n1", "n2", "n3"]
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["x"]


def test_reduce_outputs_off_keeps_graph_outputs(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    _r, out = reduce_run(run, model, ["n3"], "reduce_outputs=false")
    assert compute_names(out) == ["n3", "n4", "n5", "n6", "n7"]
    assert [o.name for o in onnx.load(str(out)).graph.output] == ["y"]


def test_dynamic_shapes_become_concrete_at_boundaries(run, tmp_path, has_nodes_script):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Transpose", ["r"], ["t"], name="tr", perm=[1, 0]),
        helper.make_node("Sigmoid", ["t"], ["y"], name="sig"),
    ]
    model = tmp_path / "dyn.onnx"
    onnx.save(make_model(nodes, [f32("x", ["N", 4])], [f32("y", [4, "N"])]), model)
    _r, out = reduce_run(run, model, ["tr"], "model_input_shapes={x:[3,4]}")
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
    r, _out = reduce_run(run, model, ["n5"], f"min_good={good}")
    assert r.summary["min_good"] == str(good)
    assert "n5" not in _names(good) and len(compute_names(good)) >= 1
    onnx.checker.check_model(str(good))


def test_constant_nodes_become_initializers_unless_kept(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(6), model)
    _, out = reduce_run(run, model, ["n3"])
    reduced = onnx.load(str(out))
    assert [n.name for n in reduced.graph.node] == ["n3"] and [i.name for i in reduced.graph.initializer] == ["c"]
    r, kept = reduce_run(run, model, ["n3"], "keep_constant_nodes=true", out=tmp_path / "kept.onnx")
    assert _names(kept) == ["const", "n3"] and r.summary["nodes_after"] == 2


def test_metadata_and_names_are_kept(run, tmp_path, has_nodes_script):
    m = chain_model(6)
    m.producer_name = "unit-test"
    helper.set_model_props(m, {"owner": "me"})
    model = tmp_path / "chain.onnx"
    onnx.save(m, model)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    _, out = reduce_run(run, model, ["n2"])
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
    _r, _ = reduce_run(run, model, ["mm2"], "external_data=true", "external_data_threshold=16", out=out)
    assert (out.parent / "reduced.onnx.data").stat().st_size >= 64 * 64 * 4
    loaded = onnx.load(str(out))
    assert compute_names(out) == ["mm2"] and onnx.numpy_helper.to_array(loaded.graph.initializer[0]).shape == (64, 64)
    # Polygraphy's size suffixes: the 16 KiB weight stays inside the model under a 1M threshold, goes out from 16K
    for threshold, outside in (("1M", False), ("16K", True)):
        out = tmp_path / threshold / "reduced.onnx"
        out.parent.mkdir()
        reduce_run(run, model, ["mm2"], "external_data=true", f"external_data_threshold={threshold}", out=out)
        stored = onnx.load(str(out), load_external_data=False).graph.initializer[0]
        assert (stored.data_location == onnx.TensorProto.EXTERNAL) is outside, threshold
    one_line_error(run(*reduce_args(model, "mm2"), "external_data_threshold=1T"), "external_data_threshold=1T")


def test_keep_intermediate_and_sorted_iteration_models(run, tmp_path, has_nodes_script):
    model = tmp_path / "chain.onnx"
    onnx.save(chain_model(8), model)
    art = tmp_path / "art"
    it = tmp_path / "candidate.onnx"
    r, _ = reduce_run(
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
        _r, out = reduce_run(
            run, model, [culprit], "model_input_shapes={X:[1,2,5,5]}", out=tmp_path / f"{culprit}.onnx"
        )
        reduced = onnx.load(str(out))
        assert compute_names(out) == [culprit]
        for vi in list(reduced.graph.input) + list(reduced.graph.output):
            assert [d.dim_value for d in vi.type.tensor_type.shape.dim] == [1, 2, 5, 5], vi.name
