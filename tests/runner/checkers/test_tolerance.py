"""Error statistics against hand-computed values, per-output tolerances, and rel_l2 on a real reduce."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from runner.checkers.compare.tolerance import Tolerances, compare_outputs, compare_tensor
from runner.errors import ConfigError

GOLDEN = np.array([1.0, 2.0, 4.0, 0.0], np.float32)
ACTUAL = np.array([1.1, 2.0, 3.0, 0.5], np.float32)
# |a - b| = [0.1, 0, 1, 0.5]; |a - b| / |b| (eps where b = 0) = [0.1, 0, 0.25, 0.5 / 2.2e-16]


def _stat(stat, atol, rtol, **kw):
    return compare_tensor(ACTUAL, GOLDEN, atol, rtol, Tolerances(stat=stat, **kw))


def test_statistics_are_the_hand_computed_values():
    s = _stat("elemwise", 0, 0)
    assert s.max_abs == pytest.approx(1.0) and s.max_rel == pytest.approx(0.25)
    assert s.mean_abs == pytest.approx(0.4) and s.median_abs == pytest.approx(0.3)
    assert s.rel_l2 == pytest.approx(math.sqrt(0.01 + 1 + 0.25) / math.sqrt(1 + 4 + 16), rel=1e-6)
    cosine = (1.1 + 4 + 12) / (math.sqrt(1.21 + 4 + 9 + 0.25) * math.sqrt(21))
    assert s.cosine == pytest.approx(cosine, rel=1e-6)
    assert s.mismatch_fraction == 0.75 and s.nan == 0 and s.inf == 0


@pytest.mark.parametrize(
    "stat, atol, rtol, passed",
    [
        ("max", 1.0, 0, True),  # max abs 1.0 within atol
        ("max", 0.99, 1e10, False),  # max rel is 0.5 / eps = 2.3e15
        ("mean", 0.4001, 0, True),  # float32 inputs: 1.1 - 1.0 is 0.10000002
        ("mean", 0.39, 0, False),
        ("median", 0.3001, 0, True),  # median of [0, 0.1, 0.5, 1]
        ("median", 0.29, 0.17, False),  # median rel of [0, 0.1, 0.25, 2.25e15] is 0.175
        ("median", 0.29, 0.18, True),  # within rtol instead
        ("rel_l2", 0, 0.25, True),  # 1.1225 / 4.5826 = 0.245
        ("rel_l2", 1e9, 0.24, False),  # rel_l2 ignores atol
    ],
)
def test_each_statistic_decides(stat, atol, rtol, passed):
    assert _stat(stat, atol, rtol).passed is passed


def test_quantile_takes_error_quantile():
    assert _stat("quantile", 0.63, 0, quantile=0.75).passed  # 75th percentile of [0, .1, .5, 1] is 0.625
    s = _stat("quantile", 0.62, 0, quantile=0.75)
    assert not s.passed and s.statistic == pytest.approx(0.625, rel=1e-6)


def test_nan_where_golden_is_finite_fails_any_statistic():
    actual = ACTUAL.copy()
    actual[1] = np.nan
    for stat in ("elemwise", "max", "mean", "median", "quantile", "rel_l2"):
        s = compare_tensor(actual, GOLDEN, 1e9, 1e9, Tolerances(stat=stat))
        assert not s.passed and s.nan == 1 and "NaN/Inf" in s.problem


def test_per_output_tolerances():
    rule = Tolerances(atol={"loose": 1.0, "default": 1e-3}, rtol=0, stat="max")
    ok, stats, problems = compare_outputs(
        {"loose": ACTUAL, "strict": ACTUAL}, {"loose": GOLDEN, "strict": GOLDEN}, rule
    )
    assert not ok and [p.split(":")[0] for p in problems] == ["strict"]
    assert stats["loose"]["passed"] and rule.for_output("other") == (1e-3, 0.0)


@pytest.mark.parametrize(
    "kw", [{"atol": -1}, {"rtol": {"y": -0.1}}, {"stat": "l1"}, {"quantile": 1.5}, {"max_mismatch_fraction": 1.0}]
)
def test_bad_rules(kw):
    with pytest.raises(ConfigError):
        Tolerances(**kw)


def test_reduce_by_rel_l2_finds_the_scaled_weight(run, tmp_path):
    """Tensors of very different scales judged by one scale-free threshold: the answer is the node whose
    weight was scaled, not the large tensors nearby."""
    from tests.helpers.models import f32, make_model

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.random((8, 8)) * 10 ** (i % 3 * 2)).astype(np.float32), f"w{i}") for i in range(6)
    ]
    nodes = [
        onnx.helper.make_node(
            "MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], ["y" if i == 5 else f"h{i}"], name=f"mm{i}"
        )
        for i in range(6)
    ]
    original = make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], weights)
    path = tmp_path / "orig.onnx"
    onnx.save(original, path)
    golden = tmp_path / "golden.npz"
    assert run("mode=repeat", "until=1", f"model={path}", "checker=compare", f"save_golden={golden}").returncode == 0
    w3 = numpy_helper.to_array(original.graph.initializer[3]) * 1.05
    original.graph.initializer[3].CopyFrom(numpy_helper.from_array(w3, "w3"))
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(original, perturbed)
    r = run(
        "mode=reduce",
        f"model={perturbed}",
        "checker=compare",
        f"golden={golden}",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.01",
    )
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["mm3"]
    last = r.summary["last_check_outputs"]
    assert all({"max_abs", "max_rel", "rel_l2", "cosine", "nan", "inf"} <= set(v) for v in last.values())
    assert "rel L2" in r.stdout and "cosine" in r.stdout


@pytest.mark.slow
def test_an_fp32_model_under_fp16_emulation_runs_in_fp16(run, tmp_path):
    """As TensorRT's --fp16: a weight of 1e5 is fine in fp32 and past fp16's range once the model is converted."""
    from examples.planted import one_sensitive

    model, _, _ = one_sensitive()
    path = tmp_path / "fp32.onnx"
    onnx.save(model, path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.full((1, 8), 1e-3, np.float32))  # outputs of 100 fit fp16; the weight does not
    fp32 = run("mode=repeat", "until=1", f"model={path}", "checker=compare", f"inputs={inputs}")
    assert fp32.summary["good"] == 1
    fp16 = run(
        "mode=repeat",
        "until=1",
        f"model={path}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        f"inputs={inputs}",
    )
    assert fp16.summary["bad"] == 1 and "converted to float16" in fp16.stdout
    any_backend = run(
        "mode=repeat",
        "until=1",
        f"model={path}",
        "checker=compare",
        "checker.low_precision=float16",
        f"inputs={inputs}",
    )
    assert any_backend.summary["bad"] == 1, "checker.low_precision converts for any backend"
    reduced = run(
        "mode=reduce",
        f"model={path}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        f"inputs={inputs}",
        "checker.check_error_stat=rel_l2",
        "checker.rtol=0.01",
    )
    assert reduced.returncode == 0, reduced.stderr[-2000:]
    assert [n["name"] for n in reduced.summary["reduced_nodes"]] == ["big_mul"]


def test_precision_candidates_are_never_converted(run, tmp_path):
    """Precision decides each node's type: its all-fp32 candidate must run in fp32 under emulation."""
    from examples.planted import one_sensitive

    model, needed, _ = one_sensitive()
    path = tmp_path / "fp32.onnx"
    onnx.save(model, path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.full((1, 8), 1e-3, np.float32))
    r = run(
        "mode=precision",
        "marker=minimal",
        f"model={path}",
        f"inputs={inputs}",
        "checker=compare",
        "checker.backend=fp16_emulation",
        "checker.rtol=1e-2",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["kept_nodes"]] == needed


def test_tolerance_pairs_name_outputs_a_map_key_cannot_hold():
    rule = Tolerances(atol=[["onnx::Conv_5", 0.5], ["default", 1e-3]])
    assert rule.for_output("onnx::Conv_5")[0] == 0.5 and rule.for_output("y")[0] == 1e-3
    with pytest.raises(ConfigError, match="pairs"):
        Tolerances(atol=[["onnx::Conv_5"]])


def _torch_named(path):
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["x"], ["onnx::Conv_5"], name="n0"),
        helper.make_node("Neg", ["onnx::Conv_5"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("y", "onnx::Conv_5")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_tolerance_for_a_tensor_the_model_lacks_is_a_one_line_error(run, tmp_path):
    from tests.helpers.cli import one_line_error

    model = _torch_named(tmp_path / "m.onnx")
    ok = run("mode=repeat", "until=1", f"model={model}", "checker=compare", 'checker.atol=[["onnx::Conv_5",0.5]]')
    assert ok.returncode == 0 and ok.summary["good"] == 1, ok.stderr[-2000:]
    bad = run("mode=repeat", "until=1", f"model={model}", "checker=compare", 'checker.atol=[["onnx::Conv_6",0.5]]')
    one_line_error(bad, "onnx::Conv_6", "no tensor of the model", code=2)
