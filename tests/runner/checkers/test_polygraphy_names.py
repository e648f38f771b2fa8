"""Names under which a candidate's extra outputs are output, held against Polygraphy's own output matching."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from runner.checkers.polygraphy_names import SkippedNames
from tests.helpers.models import chain_model, graph_index

compare = pytest.importorskip("polygraphy.comparator.compare")
struct = pytest.importorskip("polygraphy.comparator.struct")


def compared_by_polygraphy(outputs, loaded):
    """The outputs of a run that Polygraphy's comparator compares with ``loaded`` ones: {output: loaded name}."""
    run = struct.IterationResult({name: np.zeros(1) for name in outputs}, runner_name="run")
    golden = struct.IterationResult({name: np.zeros(1) for name in loaded}, runner_name="golden")
    found = {}
    for index, name in enumerate(outputs):
        matched = compare.default_find_output_func(name, index, golden, base_iter_result=run)
        if matched:
            found[name] = matched[0]
    return found


# ORT-style names hold each other: "Clip@1" is inside "Clip@13", and comes first
LOADED = ["conv_0", "Clip@1", "Add@0", "Clip@13", "relu_0", "Clip@130", "y"]


@pytest.mark.parametrize(
    "boundary, extra, shown",
    [
        # "Clip@1" inside "Clip@13" comes first: the others take conv_0's name, which stays itself
        (["Clip@13"], ["conv_0", "Clip@1", "Add@0"], ["Clip@13", "conv_0"]),
        (["Clip@13"], ["Clip@1", "Add@0"], ["Clip@13", "Clip@1"]),
        (["y"], ["conv_0", "Clip@1", "Add@0", "Clip@13", "relu_0", "Clip@130"], ["y"]),
        (["Clip@130"], ["relu_0", "Clip@13"], ["Clip@130", "relu_0"]),  # Clip@130 holds Clip@1, not computed
    ],
)
def test_polygraphy_compares_the_boundary_and_at_most_one_more(boundary, extra, shown):
    names = SkippedNames(LOADED, set(LOADED)).names(boundary, extra)
    outputs = boundary + [names.get(t, t) for t in extra]
    assert len(set(outputs)) == len(outputs)
    found = compared_by_polygraphy(outputs, LOADED)
    assert sorted(found) == sorted(shown) and all(found[n] == n for n in shown), found


def test_no_safe_name_leaves_every_output_compared():
    """No boundary output's match is an output, and none of the extra tensors' either: nothing renamed."""
    assert SkippedNames(["Clip@1", "Clip@13", "a"], set()).names(["Clip@13"], ["a"]) == {}
    assert SkippedNames(["#~^|!$"], set()).names(["x"], ["y"]) == {}, "every mark character taken"


def test_renamed_outputs_hold_the_tensors_values():
    """Marked tensors output under other names through Identity nodes: the same values, the same consumers."""
    model = chain_model(6)
    index = graph_index(model)
    skipped = SkippedNames(["t0", "t1", "t2", "t3", "t4", "y"], {t for n in model.graph.node for t in n.output})
    index.mark(["t0", "t1", "t2", "t3", "t4"], skipped.names)
    units = [index.find(f"n{i}") for i in range(4)]
    sub = index.extract(units)
    onnx.checker.check_model(sub)
    outputs = [o.name for o in sub.graph.output]
    assert outputs[0] == "t3" and len(outputs) == 4 and all(o.startswith("t3#") for o in outputs[1:])
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    got = dict(zip(outputs, ort.InferenceSession(sub.SerializeToString()).run(None, {"x": x})))
    index.mark(["t0", "t1", "t2", "t3", "t4"])
    plain = index.extract(units)
    values = ort.InferenceSession(plain.SerializeToString()).run(None, {"x": x})
    want = dict(zip([o.name for o in plain.graph.output], values))
    assert sorted(want) == ["t0", "t1", "t2", "t3"]
    renamed = skipped.names(["t3"], ["t0", "t1", "t2"])
    index.mark(["t0", "t1", "t2", "t3", "t4"], skipped.names)
    assert index.renamed(units) == renamed and sorted(renamed.values()) == sorted(outputs[1:])
    for tensor, name in renamed.items():
        np.testing.assert_array_equal(got[name], want[tensor])
