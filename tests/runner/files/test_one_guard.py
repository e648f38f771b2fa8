"""Issue 74's data-loss cases that the generated tests do not reach by construction: a sweep directory holding a
user's ``sweep.json``, the API's artifact sorting given one string, the tool's own bookkeeping named as an output,
devices named as outputs, the guard itself, and a quantized model's weights named by ``output=`` or ``log_file=``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner import api
from runner.errors import ApiError, ArtifactError
from runner.write_guard import check_write, reading
from tests.helpers.checks import python_check
from tests.helpers.cli import one_line_error
from tests.helpers.models import chain_model, sha256


def test_the_guard_refuses_a_file_read_through_a_link_or_a_hard_link(tmp_path):
    read = tmp_path / "model.onnx"
    read.write_bytes(b"weights")
    (tmp_path / "soft.onnx").symlink_to(read)
    (tmp_path / "hard.onnx").hardlink_to(read)
    with reading({read: "the model"}):
        for destination in (read, tmp_path / "soft.onnx", tmp_path / "hard.onnx"):
            with pytest.raises(ArtifactError, match="it is the model"):
                check_write(destination, "output=")
        check_write(tmp_path / "other.onnx", "output=")  # anything else is no read file
    check_write(read, "output=")  # the run ended: no longer read
    with pytest.raises(ArtifactError, match="own bookkeeping"):
        check_write(tmp_path / ".onnx-debug-runner-outputs.json", "output=")


@pytest.mark.slow
def test_a_sweep_directory_holding_a_users_sweep_json_is_refused(tmp_path, chain):
    """``python -m runner -m ... hydra.sweep.dir=.`` replaced the user's ``sweep.json``."""
    (tmp_path / "sweep.json").write_text('{"mine": true}\n')
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "notes.txt").write_text("the user's folder called 0\n")
    before = (sha256(tmp_path / "sweep.json"), sha256(tmp_path / "0" / "notes.txt"))
    cmd = [sys.executable, "-m", "runner", "-m", "mode=reduce", f"model={chain}", *python_check("n2,n3")]
    proc = subprocess.run([*cmd, "hydra.sweep.dir=."], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "sweep.json" in errors[0] and "0" in errors[0], proc.stderr[-2000:]
    assert (sha256(tmp_path / "sweep.json"), sha256(tmp_path / "0" / "notes.txt")) == before


def test_sort_artifacts_refuses_one_string_for_its_list_and_moves_nothing(tmp_path, monkeypatch):
    """``api.sort_artifacts(verdict, "no", "arts")`` moved the user's files ``n`` and ``o``."""
    monkeypatch.chdir(tmp_path)
    for name in ("n", "o", "no"):
        (tmp_path / name).write_text(name)
    with pytest.raises(ApiError, match=r"give a list of files or folders, e\.g\. \['no'\]"):
        api.sort_artifacts(True, "no", "arts")
    with pytest.raises(ApiError, match="is no path"):
        api.sort_artifacts(True, ["n", 3], "arts")  # type: ignore[list-item]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n", "no", "o"]


@pytest.mark.parametrize("option", ["output", "summary", "log_file"])
def test_an_output_naming_the_tools_ledger_is_refused(run, tmp_path, chain, option):
    """``output=.onnx-debug-runner-outputs.json``: the answer, then the ledger over it, and a run that said ok."""
    r = run("mode=reduce", f"model={chain}", *python_check("n2"), f"{option}=.onnx-debug-runner-outputs.json")
    one_line_error(r, "own bookkeeping", code=2)


def test_outputs_naming_a_device_are_refused_and_log_file_may_discard(run, tmp_path, chain):
    """``output=/dev/null`` and ``summary=/dev/stdout`` made regular files ``/dev/null_1``; ``log_file=/dev/null``
    discards, as Polygraphy's ``--log-file /dev/null``."""
    before = sorted(Path("/dev").iterdir())
    for option in ("output", "summary", "replay.save"):
        one_line_error(run("mode=reduce", f"model={chain}", *python_check("n2"), f"{option}=/dev/null"), "device")
    r = run("mode=reduce", f"model={chain}", *python_check("n2"), "log_file=/dev/null", "output=r.onnx")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(Path("/dev").iterdir()) == before


def _quantized_with_data(folder: Path) -> Path:
    """A float model and a QDQ copy of it whose weights are external data ``q.bin``."""
    weight = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]
    inp = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])]
    float_graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "f", inp, out, [weight])
    onnx.save(helper.make_model(float_graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "m.onnx")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
        helper.make_node("MatMul", ["xd", "w"], ["y"], name="mm"),
    ]
    q_graph = helper.make_graph(nodes, "q", inp, out, [weight, scale, zero])
    path = folder / "q.onnx"
    q_model = helper.make_model(q_graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(q_model, path, save_as_external_data=True, location="q.bin", size_threshold=0)
    return path


@pytest.mark.parametrize("option", ["output", "log_file"])
def test_a_quantized_models_weights_are_never_an_output(run, tmp_path, option):
    """``quantized_model=q.onnx`` with its weights in ``q.bin``: ``output=q.bin overwrite=true`` replaced them,
    ``log_file=q.bin`` truncated them; the hint offered ``overwrite=true``."""
    quantized = _quantized_with_data(tmp_path)
    np.savez(tmp_path / "x.npz", x=np.ones((1, 8), np.float32))
    before = sha256(tmp_path / "q.bin")
    r = run(
        "mode=precision",
        f"model={tmp_path / 'm.onnx'}",
        f"quantized_model={quantized}",
        "checker=compare",
        f"inputs={tmp_path / 'x.npz'}",
        f"{option}={tmp_path / 'q.bin'}",
        "overwrite=true",
    )
    line = one_line_error(r, "q.bin", "quantized_model= model's external data file", code=2)
    assert "overwrite=true" not in line
    assert sha256(tmp_path / "q.bin") == before


def test_a_python_checks_reference_named_by_checker_args_is_never_the_output(run, tmp_path):
    """``checker=python ... 'checker.args=[ref.onnx]' output=ref.onnx overwrite=true`` replaced the reference."""
    model, ref = tmp_path / "m.onnx", tmp_path / "ref.onnx"
    onnx.save(chain_model(4), model)
    onnx.save(chain_model(3), ref)
    before = sha256(ref)
    r = run(
        "mode=reduce",
        f"model={model}",
        "checker=python",
        "checker.target=tests.helpers.checks.lacks_nodes",
        f"checker.args=[n2,{ref}]",
        f"output={ref}",
        "overwrite=true",
    )
    one_line_error(r, "ref.onnx", "checker.args", code=2)
    assert sha256(ref) == before


def test_a_new_file_on_the_inode_of_a_read_file_removed_since_is_no_read_file(tmp_path):
    """A check's file named in checker.args, removed during the run, gave its inode to the replay's next temporary
    file; the guard then refused the replay as that file (inode numbers are reused)."""
    import os

    read = tmp_path / "hold"
    read.write_text("x")
    with reading({read: "a file checker.args names"}) as registry:
        identity = (read.stat().st_dev, read.stat().st_ino)
        read.unlink()
        other = tmp_path / "replay.json"
        other.write_text("{}")
        if (other.stat().st_dev, other.stat().st_ino) != identity:  # force the reuse the kernel may not repeat
            registry._by_identity[(other.stat().st_dev, other.stat().st_ino)] = (read, "a file checker.args names")
        check_write(other, "the replay")
        assert os.path.exists(other)
