"""Where a precision answer is verified (``runner.checkers.compare.arithmetics``): the arithmetics named, the
margin, a real model's run under ONNX Runtime's optimization levels, and the answer that fails one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.candidates import Verdict
from runner.checkers.compare.arithmetics import AUTO_MARGIN, Arithmetic, arithmetics, margin_of, runs_here, verify
from runner.checkers.compare.tolerance import Tolerances, compare_outputs
from runner.errors import AnswerNotVerifiedError, ConfigError
from strategies.answer_check import WrittenAnswer


def conv_bn_model() -> onnx.ModelProto:
    """``x [1, 8, 16, 16] -> Conv (8 -> 8, 3x3) -> BatchNormalization -> y``: at ``basic`` and above ONNX
    Runtime folds the BatchNormalization into the Conv's weights, which rounds differently in fp32."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.1, 3, 8).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"], name="bn"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_arithmetics_are_named_provider_and_level():
    assert Arithmetic.parse("cpu") == Arithmetic("cpu:all", "CPUExecutionProvider", "all")
    assert Arithmetic.parse(" CUDA:Disable ") == Arithmetic("cuda:disable", "CUDAExecutionProvider", "disable")
    for bad in ("gpu", "cpu:fast", "tensorrt:all"):
        with pytest.raises(ConfigError, match="PROVIDER:LEVEL"):
            Arithmetic.parse(bad)
    assert [a.name for a in arithmetics(["cpu:disable", "cpu", "cpu:all"], False)] == ["cpu:disable", "cpu:all"]


def test_auto_verifies_int8_on_both_cpu_levels_and_cuda_where_it_runs():
    names = [a.name for a in arithmetics(None, True)]
    cuda = runs_here("CUDAExecutionProvider")
    assert names == ["cpu:disable", "cpu:all"] + (["cuda:all"] if cuda else [])
    assert arithmetics(None, False) == []
    if not cuda:  # named where it cannot run: refused before the search
        with pytest.raises(ConfigError, match="does not run on this machine"):
            arithmetics(["cuda"], True)


def test_margin_is_a_fraction_of_the_tolerance():
    assert margin_of(None, True) == AUTO_MARGIN and margin_of(None, False) == 0
    assert margin_of(0.1, False) == 0.1
    for bad in (1, -0.1, float("nan"), True, "0.2"):
        with pytest.raises(ConfigError, match=r"checker.margin"):
            margin_of(bad, True)  # type: ignore[arg-type]
    rule = Tolerances(atol={"y": 0.2, "default": 0.1}, rtol=0.04, stat="rel_l2").scaled(0.75)
    assert rule.for_output("y") == pytest.approx((0.15, 0.03)) and rule.for_output("z") == pytest.approx((0.075, 0.03))
    # a rel L2 error of 0.035 passes 0.04 but not 0.04 with margin 0.25
    golden = {"y": np.ones(100, np.float32)}
    got = {"y": np.ones(100, np.float32) + np.float32(0.035)}
    assert compare_outputs(got, golden, Tolerances(atol=0, rtol=0.04, stat="rel_l2"))[0]
    assert not compare_outputs(got, golden, Tolerances(atol=0, rtol=0.04, stat="rel_l2").scaled(0.75))[0]


def test_a_model_is_judged_on_each_level_as_onnx_runtime_computes_it_there():
    """The Conv + BatchNormalization model's golden values at level ``all`` (BatchNormalization folded);
    judged bit for bit, it holds at ``all`` and not at ``disable``, which runs the two nodes apart."""
    model = conv_bn_model()
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    golden = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    samples = [{"x": x, "y": golden}]
    rule = Tolerances(atol=0, rtol=0, stat="max")

    def judge(got, sample):
        passed, stats, problems = compare_outputs(got, sample, rule)
        return passed, {n: s["statistic"] for n, s in stats.items()}, problems[0] if problems else ""

    levels = arithmetics(["cpu:disable", "cpu:all"], False)
    found = verify(model, samples, lambda s: {"x": s["x"]}, ["y"], judge, levels)
    assert found["cpu:all"]["passed"] and found["cpu:all"]["statistic"] == {"y": 0.0}
    assert not found["cpu:disable"]["passed"] and 0 < found["cpu:disable"]["statistic"]["y"] < 1e-3
    assert found["cpu:disable"]["reason"].startswith("y: ")


def test_an_answer_failing_on_an_arithmetic_is_not_stood_behind(tmp_path: Path):
    """The answer passes as searched but fails its full tolerance on one arithmetic: exit 3 (answer not
    verified), the file kept, and the summary's facts say where and with what margin."""
    out = tmp_path / "answer.onnx"
    onnx.save(conv_bn_model(), out)
    answer = WrittenAnswer(out, {}, expect_pass=True, cpu_load=False, must_load=False)
    on = {
        "cpu:disable": {"provider": "CPUExecutionProvider", "level": "disable", "passed": True, "statistic": {"y": 0}},
        "cuda:all": {
            "provider": "CUDAExecutionProvider",
            "level": "all",
            "passed": False,
            "reason": "y: rel_l2 0.061 > 0.05",
            "statistic": {"y": 0.061},
        },
    }
    with pytest.raises(AnswerNotVerifiedError, match=r"margin 0.25.*on cuda:all: y: rel_l2 0.061 > 0.05") as e:
        answer.held(Verdict(True, reason="within", verified={"margin": 0.25, "on": on}))
    assert e.value.verified["passed"] is False and e.value.verified["verified_on"] == on
    assert e.value.verified["margin"] == 0.25 and out.exists()
