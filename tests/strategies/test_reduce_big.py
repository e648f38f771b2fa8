"""A model past protobuf's 2 GB limit (opt-in: RUNNER_BIG_TESTS=1; writes about 5 GB, peaks near 7 GB RAM)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers.cli import check_cmd

pytestmark = pytest.mark.skipif(
    os.environ.get("RUNNER_BIG_TESTS") != "1", reason="set RUNNER_BIG_TESTS=1 to run the 2 GB test"
)


def test_reduce_a_model_over_2gb(run_cli, tmp_path, has_nodes_script):
    rows = 1_100_000_000 // 4 // 1024  # two fp32 weights of 1.1 GB: 2.2 GB in all, external data
    inits = [numpy_helper.from_array(np.full((rows, 1024), v, np.float32), f"w{v}") for v in (1, 2)]
    inits.append(numpy_helper.from_array(np.array([0, 5], np.int64), "idx"))
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Gather", ["w1", "idx"], ["g1"], name="gather1", axis=0),
        helper.make_node("Gather", ["w2", "idx"], ["g2"], name="gather2", axis=0),
        helper.make_node("Add", ["a", "g1"], ["s"], name="add"),
        helper.make_node("Add", ["s", "g2"], ["t"], name="add2"),
        helper.make_node("Neg", ["t"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1024])],
        inits,
    )
    model = tmp_path / "big.onnx"
    onnx.save_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        str(model),
        save_as_external_data=True,
        location="big.onnx.data",
    )
    del inits, graph
    out = tmp_path / "reduced.onnx"
    r = run_cli(
        "mode=reduce",
        f"model={model}",
        check_cmd(has_nodes_script, "{artifact}", "add2"),
        f"output={out}",
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.summary["reduced_nodes"] == [{"name": "add2", "op": "Add"}]
    onnx.checker.check_model(str(out))
