"""Issue 74's tracebacks, misleading messages and keys taken and ignored, each with real files: a working folder
whose name is not UTF-8, external data beside a user's file, fp8 on Convs too narrow for its kernels, ONNX Runtime's
dynamic quantization given as a QDQ model, the time budget's room for the answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Tuple

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from strategies.budget import FINISH_S, Budget
from tests.helpers.checks import python_check
from tests.helpers.cli import one_line_error
from tests.helpers.models import chain_model, sha256

ROOT = Path(__file__).resolve().parents[2]


def _weighted_chain(path: Path) -> Path:
    """Three MatMuls by 64x64 weights (16 KB each: external data at the default threshold)."""
    weights = [numpy_helper.from_array(np.eye(64, dtype=np.float32), f"w{i}") for i in range(3)]
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"t{i - 1}", f"w{i}"], [f"t{i}"], name=f"mm{i}")
        for i in range(3)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("t2", onnx.TensorProto.FLOAT, [1, 64])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.slow
def test_a_working_folder_whose_name_is_not_utf8_gets_a_verified_answer(tmp_path):
    """Was: the search ended, then ``TypeError: check_model_path()`` at the answer's check, answer unverified."""
    folder = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9"))
    folder.mkdir()
    onnx.save(chain_model(5), folder / "m.onnx")
    cmd = [sys.executable, "-m", "runner", "mode=reduce", "model=m.onnx", *python_check("n2"), "hydra.run.dir=run"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr
    assert b"same_bytes=True" in proc.stdout or (folder / "reduced.onnx").is_file()


def test_external_data_beside_a_users_data_file_takes_another_name(run, tmp_path):
    """``external_data=true`` beside a user's ``reduced.onnx.data``: the save removed it as stale data."""
    model = _weighted_chain(tmp_path / "m.onnx")
    users = tmp_path / "reduced.onnx.data"
    users.write_bytes(b"the user's weights")
    r = run("mode=reduce", f"model={model}", *python_check("mm1"), "external_data=true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert users.read_bytes() == b"the user's weights"
    assert Path(r.summary["output"]).name == "reduced_1.onnx"
    assert (tmp_path / "reduced_1.onnx.data").is_file()
    again = run("mode=reduce", f"model={model}", *python_check("mm1"), "external_data=true", "output=reduced_1.onnx")
    assert again.returncode == 0 and Path(again.summary["output"]).name == "reduced_1.onnx", again.stderr[-2000:]


def test_external_data_path_without_external_data_writes_the_answer(run, tmp_path):
    """``external_data_path=w2.bin`` alone: the search ran, then "cannot write reduced.onnx (None)" (onnx refused a
    location that existed in the working folder: the name this run had reserved)."""
    model = _weighted_chain(tmp_path / "m.onnx")
    r = run("mode=reduce", f"model={model}", *python_check("mm1"), "external_data_path=w2.bin", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "w2.bin").stat().st_size > 0
    onnx.checker.check_model(str(tmp_path / "reduced.onnx"))


@pytest.mark.parametrize(
    "name, words", [("chk.py", "external_data_path=chk.py would overwrite"), ("b8.onnx", "e.g. b8.bin")]
)
def test_external_data_path_refusals_name_that_key(run, tmp_path, name, words):
    model = _weighted_chain(tmp_path / "m.onnx")
    (tmp_path / "chk.py").write_text("def lacks(path, *names):\n    return True\n")
    before = sha256(tmp_path / "chk.py")
    r = run(
        "mode=reduce",
        f"model={model}",
        "checker=python",
        "checker.target=chk.lacks",
        f"checker.args=[{tmp_path / 'chk.py'}]",
        f"external_data_path={name}",
        cwd=tmp_path,
    )
    one_line_error(r, words, code=2)
    assert sha256(tmp_path / "chk.py") == before


def test_fp8_on_convs_too_narrow_for_its_kernels_says_why(run, tmp_path):
    weight = numpy_helper.from_array(np.random.default_rng(0).random((8, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="c")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 14, 14])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "small.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(1).random((1, 3, 16, 16), np.float32))
    r = run(
        "mode=precision",
        f"model={tmp_path / 'small.onnx'}",
        "low_precision=float8",
        f"inputs={tmp_path / 'x.npz'}",
        "checker=compare",
    )
    one_line_error(r, "no fp8 kernel for its 1 Conv of 16 channels or fewer", code=2)


def test_onnxruntimes_dynamic_quantization_is_named_as_such(run, tmp_path):
    """``quantized_model=`` of ``quantize_dynamic``'s model was called "a float model"."""
    from onnxruntime.quantization import quantize_dynamic

    model = _weighted_chain(tmp_path / "m.onnx")
    quantize_dynamic(str(model), str(tmp_path / "dyn.onnx"))
    np.savez(tmp_path / "x.npz", x=np.ones((1, 64), np.float32))
    r = run(
        "mode=precision",
        f"model={model}",
        f"quantized_model={tmp_path / 'dyn.onnx'}",
        "checker=compare",
        f"inputs={tmp_path / 'x.npz'}",
    )
    line = one_line_error(r, "quantize_dynamic", "QDQ", code=2)
    assert "float model" not in line


def test_a_time_budget_keeps_room_for_a_check_as_built_and_the_runs_end():
    """``budget.seconds=15`` ended at 16.25 s: the room kept was two switched checks, and the answer is checked as
    built (as the gates were), then the summary written and the process ended."""
    import time

    budget = Budget(seconds=10.0, started=time.monotonic() - 6.0)
    for _ in range(100):
        budget.took(None, False, False, seconds=0.05)
    assert budget.over() == ""  # 6 s + 2 x 0.06 s (the pace) + 0.05 s + FINISH_S: under 10
    budget.took(None, False, False, seconds=2.95)  # a check as built, the answer's own check to come
    assert "budget.seconds=10 reached" in budget.over()
    assert FINISH_S >= 0.5


@pytest.mark.slow
def test_a_dask_worker_started_in_another_folder_runs_the_check_where_the_run_started(run, tmp_path):
    """``executor=dask`` on a cluster started by hand in another folder, with the README's relative
    ``checker.cmd="python check.py {artifact} ..."``: the check ran in the worker's folder and never passed."""
    distributed = pytest.importorskip("distributed")
    user, elsewhere = tmp_path / "user", tmp_path / "elsewhere"
    user.mkdir()
    elsewhere.mkdir()
    onnx.save(chain_model(6), user / "m.onnx")
    (user / "has.py").write_text(
        "import sys, onnx\nnames = {n.name for n in onnx.load(sys.argv[1]).graph.node}\n"
        "sys.exit(1 if sys.argv[2] in names else 0)\n"
    )
    dask = str(Path(sys.executable).parent / "dask")
    port = 20000 + os.getpid() % 20000
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": elsewhere}
    scheduler = subprocess.Popen([dask, "scheduler", "--port", str(port), "--dashboard-address", ":0"], **quiet)
    worker = subprocess.Popen([dask, "worker", address, "--nthreads", "2", "--dashboard-address", ":0"], **quiet)
    try:
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
        r = run(
            "mode=reduce", "model=m.onnx", 'checker.cmd="python has.py {artifact} n3"', "executor=dask",
            f"executor.address={address}", "output=r.onnx", cwd=user,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
        assert [n["name"] for n in r.summary["reduced_nodes"]] == ["n3"]
    finally:
        for proc in (worker, scheduler):
            proc.terminate()
            proc.wait(timeout=30)


def _overflow_files(tmp_path: Path) -> Tuple[Path, Path]:
    from tests.helpers.models import overflow_model

    onnx.save(overflow_model(), tmp_path / "ov.onnx")
    np.savez(tmp_path / "x.npz", x=np.full((1, 4), 300, np.float32))
    return tmp_path / "ov.onnx", tmp_path / "x.npz"


def test_validate_on_fp16_emulation_runs_an_fp32_candidate_in_fp16(run, tmp_path):
    """``checker=validate checker.backend=fp16_emulation`` outside precision checked fp32 and passed."""
    model, x = _overflow_files(tmp_path)
    r = run("mode=reduce", f"model={model}", "checker=validate", "checker.backend=fp16_emulation", f"inputs={x}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["scale"]  # 300 x 300 = 90,000: past fp16's 65,504


def test_repeat_with_validate_reads_its_inputs_without_a_warning(run, tmp_path):
    model, x = _overflow_files(tmp_path)
    r = run("mode=repeat", "until=1", f"model={model}", "checker=validate", f"inputs={x}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not read" not in r.stdout + r.stderr
    golden = run("mode=repeat", "until=1", f"model={model}", "checker=validate", f"inputs={x}", f"golden={x}")
    assert "golden= not read" in golden.stdout + golden.stderr


@pytest.mark.parametrize("where", ["missing.json", "folder"])
def test_rankings_naming_nothing_is_one_line(run, tmp_path, where):
    """``rankings=missing.json`` (or a folder without one) ranked anew without a word."""
    model, x = _overflow_files(tmp_path)
    (tmp_path / "folder").mkdir()
    r = run("mode=precision", f"model={model}", "checker=compare", f"inputs={x}", f"rankings={tmp_path / where}")
    one_line_error(r, "rankings=", "ranking.json", code=2)


def test_compare_every_tensor_with_a_check_that_compares_none_is_one_line(run, tmp_path, chain):
    r = run("mode=reduce", f"model={chain}", *python_check("n2"), "compare_every_tensor=true")
    one_line_error(r, "compare_every_tensor=", "checker=python", code=2)
    cmd = run("mode=reduce", f"model={chain}", 'checker.cmd="python -c pass"', "compare_every_tensor=true")
    one_line_error(cmd, "compare_every_tensor=true", "--load-outputs", code=2)


def test_verbosity_naming_a_module_that_does_not_exist_is_one_line(run, chain):
    """``verbosity=[runner.nope:debug]`` was taken: its package exists."""
    r = run("mode=reduce", f"model={chain}", *python_check("n2"), "verbosity=[runner.nope:debug]")
    one_line_error(r, "no module 'runner.nope'", code=2)
