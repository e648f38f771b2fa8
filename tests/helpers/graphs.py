"""Small graphs with planted fp16 overflows, for precision tests and benchmarks: each returns
(model, the nodes that must stay in fp32, the input scale that triggers the overflow)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from tests.helpers.models import f32, make_model


def _const(name, value):
    return numpy_helper.from_array(np.array(value, np.float32), name)


def one_sensitive():
    """Mul by 1e5 (past fp16's 65504) on small inputs: only that node's weight needs fp32."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Abs", ["a"], ["b"], name="abs0"),
        helper.make_node("Mul", ["b", "C"], ["c"], name="big_mul"),
        helper.make_node("Relu", ["c"], ["d"], name="relu1"),
        helper.make_node("Neg", ["d"], ["e"], name="neg"),
        helper.make_node("Abs", ["e"], ["y"], name="abs1"),
    ]
    return make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [_const("C", 1e5)]), ["big_mul"], 1e-3


def two_branches():
    """Two Muls by constants past fp16's range on different branches, joined by an Add."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Mul", ["a", "CA"], ["pa"], name="mul_a"),
        helper.make_node("Relu", ["pa"], ["qa"], name="relu_a"),
        helper.make_node("Mul", ["a", "CB"], ["pb"], name="mul_b"),
        helper.make_node("Abs", ["pb"], ["qb"], name="abs_b"),
        helper.make_node("Add", ["qa", "qb"], ["s"], name="join"),
        helper.make_node("Relu", ["s"], ["y"], name="relu_out"),
    ]
    return (
        make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [_const("CA", 1e5), _const("CB", 2e5)]),
        ["mul_a", "mul_b"],
        1e-3,
    )


def chain():
    """x^2 overflows fp16 for x ~ 300 and the Sqrt after it must read it in fp32: both stay together."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Abs", ["a"], ["b"], name="abs0"),
        helper.make_node("Pow", ["b", "two"], ["p"], name="square"),
        helper.make_node("Sqrt", ["p"], ["r"], name="root"),
        helper.make_node("Relu", ["r"], ["s"], name="relu1"),
        helper.make_node("Neg", ["s"], ["y"], name="neg"),
    ]
    return make_model(nodes, [f32("x", [1, 8])], [f32("y", [1, 8])], [_const("two", 2.0)]), ["square", "root"], 300.0


GRAPHS = {"one_sensitive": one_sensitive, "two_branches": two_branches, "chain": chain}
