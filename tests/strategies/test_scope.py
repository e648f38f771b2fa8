"""include_nodes/exclude_nodes/include_op_types/exclude_op_types: reduce searches inside the scope and keeps the
rest, precision keeps excluded nodes in float32 outside its search, layerwise reports the nodes in scope."""

from __future__ import annotations

import csv

import numpy as np
import onnx
import pytest

from examples.planted import two_branches
from tests.helpers.cli import one_line_error

REDUCE = ["mode=reduce", "checker=python", "checker.target=tests.helpers.crashing.check"]
PRECISION = ["mode=precision", "checker=compare", "checker.backend=fp16_emulation", "checker.rtol=1e-2"]


def _names(nodes):
    return sorted(n["name"] for n in nodes)


def test_reduce_searches_inside_the_scope_and_keeps_the_rest(run, chain):
    whole = run(*REDUCE, f"model={chain}")
    assert _names(whole.summary["reduced_nodes"]) == ["n3"]
    r = run(*REDUCE, f"model={chain}", "exclude_nodes=[n5]")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _names(r.summary["reduced_nodes"]) == ["n3", "n5"]
    r = run(*REDUCE, f"model={chain}", "include_nodes=['n[0-4]']")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _names(r.summary["reduced_nodes"]) == ["n3", "n5", "n6", "n7"]
    assert r.summary["checks"] < whole.summary["checks"] + 2


@pytest.fixture
def branches(tmp_path):
    model, needed, scale = two_branches()
    path = tmp_path / "two_branches.onnx"
    onnx.save(model, path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=(scale * (1 + np.random.default_rng(0).random((1, 8)))).astype(np.float32))
    return path, inputs, sorted(needed)


@pytest.mark.slow  # three precision runs: about the 1.5 s of an unmarked test
def test_precision_keeps_excluded_nodes_in_float32_outside_the_search(run, tmp_path, branches):
    path, inputs, needed = branches
    out = tmp_path / "mixed.onnx"
    base = [*PRECISION, "marker=minimal", f"model={path}", f"inputs={inputs}", f"output={out}"]
    plain = run(*base)
    assert plain.returncode == 0 and _names(plain.summary["kept_nodes"]) == needed
    r = run(*base, f"exclude_nodes=[{needed[0]}]")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _names(r.summary["forced_float"]) == [needed[0]]
    assert _names(r.summary["kept_nodes"]) == needed[1:] and r.summary["answer_verified"]["check_passed"]
    types = {t.name: t.data_type for t in onnx.load(str(out)).graph.initializer}
    assert onnx.TensorProto.FLOAT in types.values()
    r = run(*base, "include_op_types=[Relu,Abs,Add]")  # the Muls that overflow are outside: no kept set passes
    one_line_error(r, "even with every node in scope in float32", "include_", code=2)


def test_layerwise_rows_only_for_nodes_in_scope(run, chain):
    r = run("mode=layerwise", f"model={chain}", "include_op_types=[Add]", "layerwise.plot=false")
    assert r.returncode == 0, r.stderr[-2000:]
    with open(r.run_dir / "layerwise.csv") as f:
        ops = {row["op"] for row in csv.DictReader(f)}
    assert ops == {"Add"}


@pytest.mark.parametrize(
    "option, words",
    [
        ("exclude_nodes=[nine]", "exclude_nodes: 'nine' matches no node name"),
        ("include_nodes=['n(']", "is not a regular expression"),
        ("exclude_op_types=[Conv]", "no node of op type ['Conv']"),
        ("exclude_nodes=['.*']", "leave no node"),
    ],
)
def test_bad_scope_is_a_one_line_error(run, chain, option, words):
    one_line_error(run(*REDUCE, f"model={chain}", option), words, code=2)


def test_a_culprit_outside_the_scope_is_named_as_the_scopes_doing(run, chain):
    """Issue 38: with the culprit excluded from reduce's scope every candidate holds it and fails; the error
    blamed the check. It now names the nodes outside the scope and the keys that widen it."""
    from tests.helpers.checks import python_check
    from tests.helpers.cli import one_line_error

    r = run("mode=reduce", f"model={chain}", *python_check("n5"), "exclude_nodes=[n5]")
    line = one_line_error(r, "outside the scope", "n5", "widen the scope", code=2)
    assert "fix it" not in line
