"""Output safety: every path a run writes is resolved and checked before the first check; the model and its
data are never written; default names never overwrite; files get the user's umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers.checks import reduce_args
from tests.helpers.cli import one_line_error
from tests.helpers.models import chain_model, sha256

OPTIONS = ["output", "min_good", "artifacts.iter_artifact", "summary", "replay.save", "artifacts.iter_info"]
SPELLINGS = ["absolute", "dot", "symlink", "hardlink"]


@pytest.mark.parametrize(
    "option, spelling",
    # every spelling for output=, and every option with the spellings in turn
    [("output", s) for s in SPELLINGS] + [(o, SPELLINGS[i % 4]) for i, o in enumerate(OPTIONS) if o != "output"],
)
@pytest.mark.slow
def test_no_option_may_name_the_model(run, tmp_path, chain, has_nodes_script, option, spelling):
    before = sha256(chain)
    if spelling == "absolute":
        target = str(chain)
    elif spelling == "dot":
        target = "./model.onnx"
    elif spelling == "symlink":
        (tmp_path / "link.onnx").symlink_to(chain)
        target = "link.onnx"
    else:
        os.link(chain, tmp_path / "hard.onnx")
        target = "hard.onnx"
    r = run(*reduce_args(chain, "n3"), f"{option}={target}")
    one_line_error(r, f"{option}=", "would overwrite the model", str(chain), code=2)
    assert sha256(chain) == before
    assert r.summary["checks"] == 0


def test_save_golden_and_precision_output_may_not_name_the_model(run, tmp_path, chain):
    before = sha256(chain)
    r = run("mode=reduce", f"model={chain}", "checker=compare", f"save_golden={chain}")
    one_line_error(r, "save_golden=", "would overwrite the model", code=2)
    r = run(
        "mode=precision", f"model={chain}", "checker=compare", "checker.backend=fp16_emulation", "output=./model.onnx"
    )
    one_line_error(r, "output=", "would overwrite the model", code=2)
    assert sha256(chain) == before


@pytest.mark.slow
def test_external_data_file_is_protected(run, tmp_path, has_nodes_script):
    model = chain_model(8)
    model.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "unused_w"))
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="out.onnx.data", size_threshold=0)
    data = tmp_path / "out.onnx.data"
    before = sha256(data)
    r = run(*reduce_args(path, "n3"), f"output={tmp_path / 'out.onnx'}", "external_data=true")
    one_line_error(r, "output=", "external data file", str(data), code=2)
    r = run(*reduce_args(path, "n3"), f"summary={data}")
    one_line_error(r, "summary=", "external data file", code=2)
    assert sha256(data) == before


def test_reduce_again_with_the_default_output_picks_a_free_name(run, tmp_path, has_nodes_script):
    onnx.save(chain_model(8), tmp_path / "reduced.onnx")
    before = sha256(tmp_path / "reduced.onnx")
    r = run(*reduce_args("reduced.onnx", "n3"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert sha256(tmp_path / "reduced.onnx") == before
    assert r.summary["output"] == str(tmp_path / "reduced_1.onnx")
    assert [n.name for n in onnx.load(str(tmp_path / "reduced_1.onnx")).graph.node if n.op_type != "Constant"] == ["n3"]
    assert "reduced.onnx exists; writing output=" in r.stdout + r.stderr


def test_two_options_naming_one_file(run, tmp_path, chain, has_nodes_script):
    r = run(*reduce_args(chain, "n3"), "output=same.onnx", "min_good=same.onnx")
    one_line_error(r, "min_good and output both name", code=2)


@pytest.mark.parametrize("option", ["output", "min_good", "replay.save", "artifacts.iter_info", "summary"])
@pytest.mark.slow
def test_unwritable_output_stops_before_the_first_check(run, tmp_path, chain, has_nodes_script, option):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = run(*reduce_args(chain, "n3"), f"{option}={blocker / 'sub' / 'x.json'}")
    one_line_error(r, f"{option}=", code=2)
    assert not (r.run_dir / "checks").exists(), "no check ran"


@pytest.mark.slow
def test_unwritable_run_dir_is_one_line(tmp_path, chain, has_nodes_script):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cmd = [
        sys.executable,
        "-m",
        "runner",
        *reduce_args(chain, "n3", script=has_nodes_script),
        f"hydra.run.dir={blocker / 'run'}",
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    one_line_error(r, "hydra.run.dir=", "not a writable directory", code=2)


@pytest.mark.slow
def test_files_get_the_users_umask(tmp_path, chain, has_nodes_script):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "runner",
        *reduce_args(chain, "n3", script=has_nodes_script),
        f"hydra.run.dir={run_dir}",
    ]
    r = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o027)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("summary.json", "replay.json"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o640, name


def test_a_refused_plan_leaves_no_reserved_name(run, tmp_path, chain):
    r = run(*reduce_args(chain, "n3"), f"summary={chain}")
    one_line_error(r, "summary=", "would overwrite the model", code=2)
    assert not (tmp_path / "reduced.onnx").exists(), "the default output reserved first is released"


def test_a_name_a_running_run_holds_is_skipped_and_one_a_killed_run_left_empty_is_taken_back(tmp_path):
    """``reserve``: a running run holds the lock of its name; a killed run's lock went with it, so its empty
    file is taken back. A file with content, or a link, is never taken."""
    from runner.files.reservations import reserve

    path = tmp_path / "reduced.onnx"
    name, held = reserve(path)
    assert name == path and path.stat().st_size == 0
    other, other_fd = reserve(path)
    assert other == tmp_path / "reduced_1.onnx", "the name of a running run is skipped"
    os.close(held)  # as a kill -9 lets go of it: the file stays, empty and held by nobody
    again, again_fd = reserve(path)
    assert again == path, "the empty name a killed run left is taken back"
    os.close(again_fd)
    os.close(other_fd)

    path.write_bytes(b"an answer")
    (tmp_path / "reduced_1.onnx").unlink()
    (tmp_path / "empty.onnx").write_bytes(b"")
    os.symlink(tmp_path / "empty.onnx", tmp_path / "reduced_1.onnx")
    name, fd = reserve(path)
    os.close(fd)
    assert name == tmp_path / "reduced_2.onnx", "neither a file with content nor a link is taken"
    assert path.read_bytes() == b"an answer"
    assert not list(tmp_path.glob(".*")), "no temporary name is left behind"


@pytest.mark.slow
def test_a_run_killed_outright_leaves_an_empty_name_the_next_run_takes_back(run, tmp_path, chain):
    """``kill -9`` leaves the empty ``reduced.onnx`` the run reserved; the next run writes its answer there
    instead of beside it in ``reduced_1.onnx``."""
    from tests.helpers.cli import SLOW_HAS_NODES, check_cmd, start_process, wait_for, write_script

    script = write_script(tmp_path / "slow.py", SLOW_HAS_NODES)
    check = check_cmd(script, "{artifact}", "0.5", "n3")
    proc = start_process(tmp_path, "mode=reduce", f"model={chain}", check, run_dir=tmp_path / "killed")
    wait_for(lambda: (tmp_path / "killed" / "replay.json").exists(), proc)
    proc.kill()
    proc.communicate(timeout=30)
    assert (tmp_path / "reduced.onnx").stat().st_size == 0, "the killed run's reserved name"

    r = run(*reduce_args(chain, "n3"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.summary["output"] == str(tmp_path / "reduced.onnx")
    assert [n.name for n in onnx.load(str(tmp_path / "reduced.onnx")).graph.node if n.op_type != "Constant"] == ["n3"]
    assert not (tmp_path / "reduced_1.onnx").exists()


def test_runs_reserving_names_together_never_share_one(tmp_path):
    """A name appears already locked (made and locked under a temporary name, then linked into place), so a
    run taking back abandoned names never takes one another run has just made."""
    import concurrent.futures

    from runner.files.reservations import reserve

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        reserved = list(pool.map(lambda _: reserve(tmp_path / "reduced.onnx"), range(32)))
    for _, fd in reserved:
        os.close(fd)
    assert len({name for name, _ in reserved}) == 32
    assert not list(tmp_path.glob(".*"))
