"""checker=validate (Polygraphy's ``run --validate``): no golden outputs, a candidate fails on NaN or Inf. A
precision search for the nodes that must stay fp32 so nothing overflows, a reduce to the node that makes a NaN,
through the command line and the API."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from runner import api
from runner.candidates import Candidate
from runner.checkers.validate import ValidateChecker
from runner.context import RunContext
from tests.helpers.cli import one_line_error
from tests.helpers.models import f32, make_model


def _nan_chain() -> onnx.ModelProto:
    """x -> Relu -> Neg -> Sqrt (NaN for every positive x) -> Abs -> y: the NaN is made at "root" alone."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Sqrt", ["b"], ["c"], name="root"),
        helper.make_node("Abs", ["c"], ["y"], name="abs"),
    ]
    return make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])])


def test_precision_keeps_what_would_overflow_with_no_golden_values(run, tmp_path):
    from examples.planted import two_branches

    model, _, _ = two_branches()  # two Muls by 1e5 and 2e5: everything from them on overflows fp16
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    args = ["mode=precision", f"model={path}", "checker=validate", "marker=minimal", "val_range=[1,2]"]
    r = run(*args, "checker.backend=fp16_emulation")
    assert r.returncode == 0, r.stderr[-2000:]
    kept = {n["name"] for n in r.summary["kept_nodes"]}
    assert kept == {"mul_a", "relu_a", "mul_b", "abs_b", "join", "relu_out"}, "all but the Relu before the Muls"
    assert r.summary["answer_verified"]["check_passed"] is True
    hidden = run(*args, f"output={tmp_path / 'cpu.onnx'}")  # ONNX Runtime's CPU computes fp16 Muls in fp32
    assert "hide overflows" in hidden.stdout + hidden.stderr


def test_reduce_finds_the_node_that_makes_the_nan(run, tmp_path):
    path = tmp_path / "nan.onnx"
    onnx.save(_nan_chain(), path)
    r = run("mode=reduce", f"model={path}", "checker=validate", "val_range=[1,2]", f"output={tmp_path / 'r.onnx'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n.name for n in onnx.load(tmp_path / "r.onnx").graph.node] == ["root"], "fed Neg's fp32 output"
    through_api = api.reduce(path, "validate", val_range=[1, 2], run_dir=tmp_path / "api", output=tmp_path / "a.onnx")
    assert through_api.ok and [n.name for n in onnx.load(tmp_path / "a.onnx").graph.node] == ["root"]


def test_the_verdict_names_each_output_and_its_counts(tmp_path):
    model = _nan_chain()
    path = tmp_path / "nan.onnx"
    onnx.save(model, path)
    ctx = RunContext(mode="reduce", run_dir=tmp_path, model_path=path, val_range=[-1, 1], iterations=2)
    checker = ValidateChecker.of()
    checker.bind(ctx)
    verdict = checker.check(path, 1, Candidate(key="k", label="the model", payload=lambda: model))
    assert not verdict.passed and verdict.reason.startswith("y: ") and " NaN, 0 Inf of 8 values" in verdict.reason
    finite = ValidateChecker.of(outputs=["a"])
    finite.bind(ctx)
    assert finite.check(path, 1, Candidate(key="k2", label="the model", payload=lambda: model)).passed
    assert np.isnan(checker.samples[0]["x"]).sum() == 0


def test_names_the_model_does_not_compute_are_one_line(run, tmp_path):
    path = tmp_path / "nan.onnx"
    onnx.save(_nan_chain(), path)
    r = run("mode=reduce", f"model={path}", "checker=validate", "checker.outputs=[nosuch]")
    one_line_error(r, "no node of the model computes", code=2)
    r = run("mode=reduce", f"model={path}", "checker=validate", "checker.exclude_outputs=[y]")
    one_line_error(r, "leaves none")
