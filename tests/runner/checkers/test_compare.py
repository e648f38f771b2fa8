"""checker=compare: real models on every backend, planted fp16 overflows and perturbed weights."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.candidates import Candidate
from runner.checkers.compare import CompareChecker
from runner.context import RunContext
from runner.errors import ConfigError, MissingExtraError
from tests.helpers.models import CLASSIFIER, DETECTOR, need

SHAPES = {str(DETECTOR): {"x": [1, 3, 64, 64]}, str(CLASSIFIER): {"x": [1, 3, 48, 192]}}


def _cfg(model, shapes=None, **kw):
    return RunContext(mode="reduce", run_dir=Path(model).parent, model_path=Path(model), input_shapes=shapes, **kw)


def _check(checker, model_path: Path, key="k"):
    return checker.check(model_path, 1, Candidate(key, "candidate"))


def overflow_model() -> onnx.ModelProto:
    """fp16 model: x*x overflows fp16 for x near 3e3, but the result /1000 and summed fits."""
    k = helper.make_tensor("k", TensorProto.FLOAT16, [], [1000.0])
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
        helper.make_node("Div", ["sq", "k"], ["d"], name="scale"),
        helper.make_node("ReduceSum", ["d"], ["y"], name="sum", keepdims=0),
    ]
    g = helper.make_graph(
        nodes,
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [])],
        [k],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("model", [DETECTOR, CLASSIFIER], ids=["detector", "classifier"])
@pytest.mark.parametrize("backend", ["onnxruntime", "onnx_reference"])
def test_real_models_pass_against_themselves(model, backend):
    need(model)
    checker = CompareChecker.of(backend=backend, atol=1e-4, rtol=1e-4)
    checker.bind(_cfg(model, SHAPES[str(model)]))
    verdict = _check(checker, model)
    assert verdict.passed, verdict.reason
    assert set(verdict.outputs) == {o.name for o in onnx.load(str(model)).graph.output}


def test_real_fp32_models_under_fp16_emulation_run_in_fp16():
    """An fp32 model under fp16_emulation runs as TensorRT's --fp16 would: the classifier stays close by
    rel_l2; the detector breaks even on [0, 1) inputs (its BatchNormalization variance of 9.8e7 is past
    fp16's 65504), on the output after that node's branch."""
    classifier = CompareChecker.of(backend="fp16_emulation", check_error_stat="rel_l2", rtol=1e-2)
    classifier.bind(_cfg(need(CLASSIFIER), SHAPES[str(CLASSIFIER)]))
    verdict = _check(classifier, CLASSIFIER)
    assert verdict.passed, verdict.reason
    out = next(iter(verdict.outputs.values()))
    assert 0 < out["rel_l2"] < 1e-2 and out["max_abs"] > 1e-4, "it really ran in fp16"
    detector = CompareChecker.of(backend="fp16_emulation", check_error_stat="rel_l2", rtol=1e-2)
    detector.bind(_cfg(need(DETECTOR), SHAPES[str(DETECTOR)]))
    assert not _check(detector, DETECTOR).passed


@pytest.mark.parametrize("model", [DETECTOR, CLASSIFIER], ids=["detector", "classifier"])
def test_bf16_emulation_raises_the_opset_of_an_fp32_model_below_13(model, caplog):
    """Both real models are below opset 13 (no Cast to bfloat16): the conversion raises their opset
    (logged) and the candidate runs; ops ONNX defines no bfloat16 for at that opset stay fp32."""
    checker = CompareChecker.of(backend="bf16_emulation", check_error_stat="rel_l2", rtol=0.05)
    checker.bind(_cfg(need(model), SHAPES[str(model)]))
    with caplog.at_level(logging.INFO):
        verdict = _check(checker, model)
    assert not verdict.error, verdict.error
    assert "opset was raised" in caplog.text and "stay float32" in caplog.text
    out = next(iter(verdict.outputs.values()))
    assert out["rel_l2"] > 0, "it really ran with bf16 tensors"


def test_fp16_overflow_fails_on_emulation_and_passes_on_onnxruntime(tmp_path):
    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.full(4, 3000, np.float16))
    results = {}
    for backend in ("onnxruntime", "fp16_emulation"):
        checker = CompareChecker.of(backend=backend, reference="onnxruntime")
        checker.bind(_cfg(path, inputs=str(inputs)))
        results[backend] = _check(checker, path)
    assert results["onnxruntime"].passed
    emu = results["fp16_emulation"]
    assert not emu.passed and emu.reason.startswith("y: ") and "NaN/Inf" in emu.reason
    assert emu.outputs["y"]["new_nonfinite"] == 1


def test_perturbed_weight_fails_with_the_right_output(tmp_path):
    model = onnx.load(str(need(CLASSIFIER)))
    golden = tmp_path / "golden.npz"
    checker = CompareChecker.of()
    checker.bind(_cfg(CLASSIFIER, SHAPES[str(CLASSIFIER)], save_golden=str(golden)))
    assert _check(checker, CLASSIFIER).passed
    # perturb one Conv weight (held in a Constant node) near the end
    conv = [n for n in model.graph.node if n.op_type == "Conv"][-3]
    const = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == conv.input[1])
    w = numpy_helper.to_array(const.attribute[0].t).copy()
    w.flat[0] += 5.0
    const.attribute[0].t.CopyFrom(numpy_helper.from_array(w, const.attribute[0].t.name))
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(model, perturbed)
    loaded = CompareChecker.of(atol=1e-4, rtol=1e-4)
    loaded.bind(_cfg(perturbed, SHAPES[str(CLASSIFIER)], golden=str(golden)))
    verdict = _check(loaded, perturbed)
    out = model.graph.output[0].name
    assert not verdict.passed and verdict.reason.startswith(f"{out}: ")
    assert verdict.outputs[out]["max_abs"] > 1e-4


@pytest.mark.slow
def test_reduce_with_compare_finds_the_perturbed_node(run, tmp_path):
    model = onnx.load(str(need(DETECTOR)))
    shapes = "model_input_shapes={x:[1,3,64,64]}"
    golden = tmp_path / "golden.npz"
    # golden values of every tensor of the original model, written by the checker itself
    checker = CompareChecker.of()
    checker.bind(_cfg(DETECTOR, {"x": [1, 3, 64, 64]}, save_golden=str(golden)))
    conv = [n for n in model.graph.node if n.op_type == "Conv"][20]
    const = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == conv.input[1])
    w = numpy_helper.to_array(const.attribute[0].t).copy()
    w *= 10.0  # 1.5x is absorbed downstream on random inputs; 10x reaches the output
    const.attribute[0].t.CopyFrom(numpy_helper.from_array(w, const.attribute[0].t.name))
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(model, perturbed)
    out = tmp_path / "reduced.onnx"
    r = run("mode=reduce", f"model={perturbed}", "checker=compare", f"golden={golden}", shapes, f"output={out}")
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    names = [n.name for n in onnx.load(str(out)).graph.node if n.op_type != "Constant"]
    assert names == [conv.name]
    assert r.summary["checks"] <= 15


def test_tensorrt_backend_without_tensorrt_names_the_extra(run, tmp_path):
    from runner.trt import tensorrt_available

    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    with pytest.raises(MissingExtraError, match=r"\[trt\]"):
        CompareChecker.of(backend="tensorrt")
    r = run("mode=reduce", f"model={need(CLASSIFIER)}", "checker=compare", "checker.backend=tensorrt")
    assert r.returncode == 2 and "install the 'trt' extra" in r.stderr and "Traceback" not in r.stderr


def test_bad_tolerances_and_backend():
    with pytest.raises(ConfigError):
        CompareChecker.of(atol=-1)
    with pytest.raises(ConfigError):
        CompareChecker.of(max_mismatch_fraction=1.5)
    with pytest.raises(ConfigError, match="unknown"):
        CompareChecker.of(backend="nope")


def test_max_mismatch_fraction_allows_a_few_outliers(tmp_path):
    from runner.checkers.compare.tolerance import Tolerances, compare_tensor

    golden = np.zeros(100, np.float32)
    actual = golden.copy()
    actual[:3] = 1.0
    assert not compare_tensor(actual, golden, 1e-3, 0, Tolerances(max_mismatch_fraction=0.0)).passed
    assert compare_tensor(actual, golden, 1e-3, 0, Tolerances(max_mismatch_fraction=0.05)).passed
    stats = compare_tensor(actual, golden, 1e-3, 0, Tolerances())
    assert stats.mismatch_fraction == pytest.approx(0.03) and stats.max_abs == 1.0


@pytest.mark.slow
def test_python_checker_cli(run_cli, tmp_path):
    (tmp_path / "mychecks.py").write_text(
        "import os\ndef even(path):\n    return int(os.environ.get('RUNNER_ITERATION', '0')) % 2 == 0\n"
        "calls = []\ndef second_fails(path):\n    calls.append(path)\n    return len(calls) != 2\n"
    )
    r = run_cli("mode=repeat", "until=bad", "checker=python", "checker.target=mychecks.second_fails")
    assert r.returncode == 0, r.stderr
    assert r.summary["runs"] == 2 and r.summary["bad"] == 1
    bad = run_cli("mode=repeat", "until=1", "checker=python", "checker.target=mychecks.nope")
    assert bad.returncode == 2 and "checker.target=mychecks.nope: mychecks has no nope" in bad.stderr


def _fp16_reduce(fp16_path, golden) -> list:
    """A reduce of an fp16 model under fp16 emulation against fp32 golden values (rtol 1e-2)."""
    return [
        "mode=reduce",
        f"model={fp16_path}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.rtol=1e-2",
        f"golden={golden}",
    ]


def _fp16_model_and_fp32_golden(run, tmp_path, fp32, x):
    """The fp16 workflow's first half: save ``fp32`` converted to fp16, and record the fp32 model's values
    on input ``x`` with save_golden. Returns (the fp16 model's path, the golden file)."""
    from runner.lowp.convert import convert_except

    fp32_path, fp16_path = tmp_path / "fp32.onnx", tmp_path / "fp16.onnx"
    onnx.save(fp32, fp32_path)
    onnx.save(convert_except(fp32, []), fp16_path)
    inputs, golden = tmp_path / "x.npz", tmp_path / "golden.npz"
    np.savez(inputs, x=x)
    first = run(
        "mode=repeat", "until=1", f"model={fp32_path}", "checker=compare", f"inputs={inputs}", f"save_golden={golden}"
    )
    assert first.returncode == 0 and first.summary["good"] == 1, first.stderr
    return fp16_path, golden


def test_reduce_an_fp16_model_against_fp32_golden_values(run, tmp_path):
    """The fp16 workflow: golden values from the fp32 model, the fp16 model reduced under emulation."""
    from onnx import helper as h

    from tests.helpers.models import f32, make_model

    nodes = [
        h.make_node("Relu", ["x"], ["a"], name="relu"),
        h.make_node("Mul", ["a", "a"], ["sq"], name="square"),
        h.make_node("Div", ["sq", "k"], ["d"], name="scale"),
        h.make_node("ReduceSum", ["d"], ["y"], name="sum", keepdims=0),
        h.make_node("Neg", ["x"], ["n"], name="neg"),
        h.make_node("Abs", ["n"], ["z"], name="abs"),
    ]
    fp32 = make_model(
        nodes,
        [f32("x", [4])],
        [f32("y", []), f32("z", [4])],
        [numpy_helper.from_array(np.array(1000.0, np.float32), "k")],
    )
    fp16_path, golden = _fp16_model_and_fp32_golden(run, tmp_path, fp32, np.full(4, 3000, np.float32))
    out = tmp_path / "reduced.onnx"
    r = run(*_fp16_reduce(fp16_path, golden), f"output={out}")
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["square"]
    reduced = onnx.load(str(out))
    assert reduced.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16, (
        "the subgraph is the fp16 model's own"
    )


def _contrib_model(path):
    """A model ONNX Runtime runs but the ONNX reference evaluator cannot (a com.microsoft op)."""
    from onnx import helper as h

    from tests.helpers.models import f32

    node = h.make_node("Gelu", ["x"], ["y"], name="gelu", domain="com.microsoft")
    graph = h.make_graph([node], "g", [f32("x", [1, 4])], [f32("y", [1, 4])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("on_error, code, passed", [("fail", 0, False), ("pass", 0, True), ("stop", 2, None)])
def test_a_candidate_the_backend_cannot_run(run, tmp_path, on_error, code, passed):
    model = _contrib_model(tmp_path / "contrib.onnx")
    r = run(
        "mode=repeat",
        "until=2",
        f"model={model}",
        "checker=compare",
        "checker.backend=onnx_reference",
        f"checker.on_error={on_error}",
    )
    assert r.returncode == code, r.stderr[-2000:]
    if on_error == "stop":
        assert "cannot run the candidate of iteration 1" in r.stderr and "checker.on_error=fail" in r.stderr
        return
    s = r.summary
    assert s["errors"] == 2 and (s["good"] if passed else s["bad"]) == 2
    entries = r.replay["iterations"]
    assert all(e["error"] and e["passed"] is passed for e in entries)
    assert (r.stdout + r.stderr).count("cannot run the candidate") == 1, "warned once"


def _dynamic_overflow_model():
    """fp32, input x of dynamic length: x*x overflows fp16 for x near 3000 (a node named "square")."""
    from onnx import helper as h

    nodes = [
        h.make_node("Relu", ["x"], ["a"], name="relu"),
        h.make_node("Mul", ["a", "a"], ["sq"], name="square"),
        h.make_node("Div", ["sq", "k"], ["d"], name="scale"),
        h.make_node("Neg", ["d"], ["y"], name="neg"),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        [numpy_helper.from_array(np.array(1000.0, np.float32), "k")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_input_shapes_come_from_the_golden_values(run, tmp_path):
    """No inputs= and no model_input_shapes: shapes come from golden.npz, not 1 per dynamic dim."""
    fp16_path, golden = _fp16_model_and_fp32_golden(
        run, tmp_path, _dynamic_overflow_model(), np.full(6, 3000, np.float32)
    )
    r = run(*_fp16_reduce(fp16_path, golden))
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert r.summary["errors"] == 0, "no candidate at the wrong shape"
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["square"]


def test_recorded_values_that_do_not_fit_the_model(run, tmp_path):
    from tests.helpers.cli import one_line_error

    path = tmp_path / "m.onnx"
    onnx.save(_dynamic_overflow_model(), path)
    golden = tmp_path / "golden.npz"
    np.savez(golden, x=np.ones((2, 3), np.float32), y=np.ones((2, 3), np.float32))
    r = run("mode=reduce", f"model={path}", "checker=compare", f"golden={golden}")
    one_line_error(r, "golden=", "has shape [2, 3]", code=2)
    assert r.summary["checks"] == 0


def test_an_unknown_on_error_is_one_line_for_both_checkers_that_take_it():
    """``runner.checkers.on_error.OnError`` serves the compare and the python checker."""

    from runner.checkers.python import PythonChecker
    from runner.errors import ConfigError

    line = r"checker\.on_error: Invalid value 'maybe', expected one of \[fail, pass, stop\]"
    with pytest.raises(ConfigError, match=line):
        CompareChecker.of(on_error="maybe")
    with pytest.raises(ConfigError, match=line):
        PythonChecker.of("os.path.exists", on_error="maybe")
