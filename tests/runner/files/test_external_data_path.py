"""external_data_path= (Polygraphy's --external-data-path): the answers' data file under a name of the user's, held to
the output rule like every file a run writes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tests.helpers.checks import compute_names, reduce_args
from tests.helpers.cli import one_line_error
from tests.helpers.models import f32, make_model


def _weighted(tmp_path):
    """Two MatMuls on one 64x64 weight (16 KiB): the needed one, mm2, keeps it."""
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).random((64, 64), dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("MatMul", ["b", "w"], ["y"], name="mm2"),
    ]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [f32("x", [1, 64])], [f32("y", [1, 64])], [w]), path)
    return path


def test_the_answer_writes_its_tensors_to_the_named_file_and_a_rerun_replaces_it(run, tmp_path):
    model = _weighted(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    args = [*reduce_args(model, "mm2"), f"output={out / 'r.onnx'}", "external_data_path=weights.bin"]
    first = run(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    stored = onnx.load(str(out / "r.onnx"), load_external_data=False).graph.initializer[0]
    assert {e.key: e.value for e in stored.external_data}["location"] == "weights.bin"
    assert (out / "weights.bin").stat().st_size == 64 * 64 * 4 and not (out / "r.onnx.data").exists()
    assert compute_names(out / "r.onnx") == ["mm2"]
    again = run(*args)
    assert again.returncode == 0 and sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "r.onnx",
        "weights.bin",
    ], "the run's own files replaced, no _1 names"


def test_a_file_of_the_users_two_answers_sharing_it_and_a_folder_are_refused(run, tmp_path):
    model = _weighted(tmp_path)
    mine = tmp_path / "weights.bin"
    mine.write_bytes(b"the user's weights")
    args = [*reduce_args(model, "mm2"), f"output={tmp_path / 'r.onnx'}"]
    one_line_error(run(*args, "external_data_path=weights.bin"), "no run of this tool wrote it", code=2)
    assert mine.read_bytes() == b"the user's weights"
    shared = run(*args, f"min_good={tmp_path / 'g.onnx'}", "external_data_path=w2.bin")
    one_line_error(shared, "would share", code=2)
    one_line_error(run(*args, "external_data_path=sub/w.bin"), "give a file name", code=2)
    assert not (tmp_path / "w2.bin").exists(), "a refused plan leaves nothing"
