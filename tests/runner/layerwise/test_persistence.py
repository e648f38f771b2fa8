"""Divergences that reach a graph output and those a node absorbs, on small graphs built here."""

from __future__ import annotations

from onnx import helper

from runner.layerwise.persistence import trace
from tests.helpers.models import f32, make_model


def _masked_softmax():
    """scores + mask -> Softmax -> MatMul -> y, with a pass-through Cast between the Add and the Softmax."""
    nodes = [
        helper.make_node("Relu", ["x"], ["scores"], name="scores"),
        helper.make_node("Add", ["scores", "mask"], ["masked"], name="mask_add"),
        helper.make_node("Cast", ["masked"], ["masked32"], name="inserted_cast", to=1),
        helper.make_node("Softmax", ["masked32"], ["probs"], name="softmax"),
        helper.make_node("Neg", ["probs"], ["y"], name="out"),
    ]
    return make_model(nodes, [f32("x", [1, 4]), f32("mask", [1, 4])], [f32("y", [1, 4])])


JUDGED = {"scores", "mask_add", "softmax", "out"}


def test_a_divergence_that_softmax_absorbs_is_absorbed_by_it_through_a_pass_through_cast():
    persisting, absorbed = trace(_masked_softmax(), JUDGED, {"mask_add"})
    assert persisting == set() and absorbed == {"mask_add": "softmax"}


def test_a_divergence_that_reaches_the_output_persists():
    persisting, absorbed = trace(_masked_softmax(), JUDGED, {"mask_add", "softmax", "out"})
    assert persisting == {"mask_add", "softmax", "out"} and absorbed == {}


def test_a_divergence_persists_through_one_branch_even_if_another_absorbs_it():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="src"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="absorbs"),
        helper.make_node("Neg", ["a"], ["c"], name="carries"),
        helper.make_node("Add", ["b", "c"], ["y"], name="join"),
    ]
    model = make_model(nodes, [f32("x", [2])], [f32("y", [2])])
    persisting, absorbed = trace(model, {"src", "absorbs", "carries", "join"}, {"src", "carries", "join"})
    assert persisting == {"src", "carries", "join"} and absorbed == {}
    persisting, absorbed = trace(model, {"src", "absorbs", "carries", "join"}, {"src", "carries"})
    assert persisting == set() and absorbed == {"src": "absorbs", "carries": "join"}


def test_precision_ranks_on_the_checker_backend_only_on_a_device():
    from runner.checkers.compare.comparison import on_device

    assert on_device("onnxruntime", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert on_device("tensorrt", [])
    assert not on_device("onnxruntime", ["CPUExecutionProvider"]) and not on_device("fp16_emulation", [])
