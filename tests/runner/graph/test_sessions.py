"""The tool's ONNX Runtime sessions (``runner.graph.sessions``)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from runner.graph.sessions import SESSION_CONFIG, session_for


def test_sessions_do_not_spin_and_still_run() -> None:
    """Every session takes ``SESSION_CONFIG``: its intra-op threads block between operators instead of spinning
    (a spinning pool burns the cores the tool's other threads and processes need)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    session = session_for(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    options = session.get_session_options()
    assert SESSION_CONFIG == {"session.intra_op.allow_spinning": "0"}
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    (y,) = session.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    assert y.tolist() == [0.0, 2.0]
