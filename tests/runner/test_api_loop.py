"""A debug loop of one's own through the API (Polygraphy's API guide: mark every tensor with ``ModifyOutputs``, then
``run_check`` and ``sort_artifacts`` each iteration): ``runner.api.run_check`` and ``runner.api.sort_artifacts``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from runner import api
from runner.api import ApiError
from tests.helpers.models import CLASSIFIER, chain_model, need

SHAPES = {"x": [1, 3, 48, 192]}


def _scaled(model: onnx.ModelProto, conv: str, factor: float) -> onnx.ModelProto:
    """A copy with ``conv``'s weight scaled by ``factor``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weight = next(n for n in copy.graph.node if n.name == conv).input[1]
    inits = [i for i in copy.graph.initializer if i.name == weight]
    consts = [a.t for n in copy.graph.node if n.op_type == "Constant" and n.output[0] == weight for a in n.attribute]
    tensor = (inits or consts)[0]  # an initializer, or a Constant node's value
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * np.float32(factor), tensor.name))
    return copy


def test_the_api_guides_loop_marks_every_tensor_checks_and_sorts(tmp_path):
    from polygraphy import constants
    from polygraphy.backend.onnx import ModifyOutputs, OnnxFromPath

    classifier = need(CLASSIFIER)
    marked = ModifyOutputs(OnnxFromPath(str(classifier)), outputs=constants.MARK_ALL)()
    conv = next(n.name for n in marked.graph.node if n.op_type == "Conv")
    candidate = tmp_path / "candidate.onnx"
    verdicts = []
    for iteration, model in enumerate([marked, _scaled(marked, conv, 1.5)], 1):
        onnx.save(model, candidate)
        verdict = api.run_check(candidate, "compare", iteration=iteration, model=classifier, model_input_shapes=SHAPES)
        api.sort_artifacts(verdict, [candidate], tmp_path / "artifacts", iteration=iteration)
        verdicts.append(verdict)
    assert verdicts[0].passed and len(verdicts[0].outputs) > 100, "every marked tensor compared"
    assert not verdicts[1].passed
    failing = [name for name, stats in verdicts[1].outputs.items() if not stats["passed"]]
    assert failing, "the tensors after the scaled Conv fail"
    assert [p.name.split("_iter")[1][:1] for p in (tmp_path / "artifacts" / "good").iterdir()] == ["1"]
    assert [p.name.split("_iter")[1][:1] for p in (tmp_path / "artifacts" / "bad").iterdir()] == ["2"]
    assert not candidate.exists(), "moved, not copied"


def test_a_command_a_callable_and_refusals(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain_model(4), path)
    assert api.run_check(path, "test -s {artifact}").passed
    failed = api.run_check(path, "sh -c 'echo broken; exit 3'", fail_regex=["broken"])
    assert not failed.passed and failed.returncode == 3
    seen = []
    assert not api.run_check(path, lambda p: seen.append(p) or False, iteration=7).passed and seen == [str(path)]
    with pytest.raises(ApiError, match="give model=PATH"):
        api.run_check(path, "validate")
    assert api.run_check(path, "validate", model=path).passed
    with pytest.raises(ApiError, match=r"set checker\.isolate=true"):  # as on the command line
        api.run_check(path, lambda p: True, timeout_s=5)
    with pytest.raises(ApiError, match="no_such_key"):
        api.run_check(path, "compare", model=path, no_such_key=1)
    moved = api.sort_artifacts(True, [path], tmp_path / "art")
    assert moved[0].parent.name == "good" and moved[0].exists()
