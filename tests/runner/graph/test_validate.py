"""Validating what the tool builds: reduce's subgraphs by their boundary, as strict inference would judge them."""

from __future__ import annotations

import random

import onnx
import pytest
from onnx import TensorProto

from runner.errors import InvalidCandidateError
from runner.graph.load import load_model
from runner.graph.validate import SubgraphValidator, Validator
from tests.helpers.models import CLASSIFIER, chain_model, graph_index, need


def test_subgraphs_of_a_real_model_pass_by_their_boundary_as_by_strict_inference():
    """Random node sets of the classifier (convolutions, activations, a head), extracted: the boundary check
    and full strict inference agree on every one (all valid)."""
    index = graph_index(load_model(need(CLASSIFIER)), {"x": [1, 3, 48, 192]})
    by_boundary, strict = SubgraphValidator(index.model), Validator(index.model)
    assert by_boundary.strict and by_boundary.types
    rng = random.Random(0)
    units = sorted(index.units)
    for size in (1, 3, 10, 40, len(units) // 2, len(units)):
        for _ in range(3):
            model = index.extract(rng.sample(units, size))
            assert by_boundary.check(model, "a subgraph") is model
            assert strict.check(model, "a subgraph") is model


def test_a_boundary_declared_with_another_type_is_refused_naming_the_tensor():
    index = graph_index(chain_model(6))
    validator = SubgraphValidator(index.model)
    validator.check(index.extract(index.units), "the whole model")  # the first model: held to strict inference
    model = index.extract([2, 3])
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(InvalidCandidateError, match=rf"at tensor {model.graph.input[0].name}: declared float16 where"):
        validator.check(model, "building the candidate of 2 nodes")


def test_a_subgraph_that_reads_a_tensor_nothing_produces_is_refused_naming_the_node():
    index = graph_index(chain_model(6))
    validator = SubgraphValidator(index.model)
    validator.check(index.extract(index.units), "the whole model")
    model = index.extract([2, 3])
    del model.graph.input[:]  # the first node's input is no longer declared
    with pytest.raises(InvalidCandidateError, match=r"made an invalid model at node"):
        validator.check(model, "building the candidate of 2 nodes")


def test_the_first_model_and_a_tensor_the_source_never_typed_get_strict_inference():
    """The first model checked, and one declaring a tensor the source's inference has no type for, are held to
    strict inference: a Relu declared to output int64 is refused though its tensor is new to the boundary check."""
    index = graph_index(chain_model(4))
    validator = SubgraphValidator(index.model)
    first = index.extract([1])
    first.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(InvalidCandidateError):
        validator.check(first, "the first candidate")
    model = index.extract([1])
    node = model.graph.node[0]
    node.output[0] = "renamed"
    model.graph.output[0].name = "renamed"
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    assert "renamed" not in validator.types
    with pytest.raises(InvalidCandidateError, match="renamed"):
        validator.check(model, "a candidate")
    assert onnx.checker.check_model(index.extract([1])) is None
