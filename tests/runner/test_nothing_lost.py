"""Nothing of the user's is lost: every input guarded from what a run writes or moves, output to a closed
pipe, a full disk, a replay with a wrong verdict, and bad values that must be one-line errors."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from runner.checkers.command import substitute
from tests.helpers.checks import python_check, reduce_args
from tests.helpers.cli import one_line_error
from tests.helpers.models import CLASSIFIER, chain_model, need, sha256
from tests.test_readme import ROOT, _quick_start


def _quick_start_argv(tmp_path: Path) -> list:
    argv = _quick_start()
    return [sys.executable, *argv[1:], f"output={tmp_path / 'reduced.onnx'}", f"hydra.run.dir={tmp_path / 'run'}"]


@pytest.mark.slow
def test_a_reader_that_goes_away_never_ends_the_run(tmp_path):
    """``python -m runner ... 2>&1 | head -1``: the run finishes, and writes its answer and summary."""
    proc = subprocess.Popen(
        _quick_start_argv(tmp_path),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()  # what head does after its first line
    assert proc.wait(timeout=600) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "ok" and (tmp_path / "reduced.onnx").is_file()


def _external_model(folder: Path, data_name: str, count: int, size: int) -> Path:
    """A chain of ``count`` MatMuls by ``size``x``size`` weights, saved with external data ``data_name``."""
    folder.mkdir()
    weights, nodes = [], []
    for i in range(count):
        weights.append(numpy_helper.from_array(np.eye(size, dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["x" if i == 0 else f"t{i - 1}", f"w{i}"], [f"t{i}"], name=f"mm{i}"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info(f"t{count - 1}", TensorProto.FLOAT, [1, size])],
        weights,
    )
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, location=data_name, size_threshold=0)
    return path


@pytest.mark.slow
def test_a_64_mb_model_whose_data_is_weights_bin_survives_a_run_in_its_own_folder(run, tmp_path):
    """Run directory and iteration artifacts in the model's folder: the shared weights take another name
    and the model still loads, byte for byte the same."""
    model = _external_model(tmp_path / "user", "weights.bin", 4, 2048)  # 4 x 16 MiB
    data = model.parent / "weights.bin"
    before = (sha256(model), sha256(data))
    r = run(
        "mode=reduce",
        f"model={model}",
        *python_check("mm2"),
        f"artifacts.iter_artifact={model.parent / 'candidate.onnx'}",
        f"output={tmp_path / 'reduced.onnx'}",
        run_dir=model.parent,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["mm2"]
    assert (sha256(model), sha256(data)) == before
    onnx.checker.check_model(onnx.load(str(model)))
    assert (model.parent / "weights_1.bin").is_file(), "the run's own shared weights"


def test_artifacts_paths_naming_the_models_folder_is_refused(run, tmp_path, chain):
    before = sha256(chain)
    r = run(*reduce_args(chain, "n3"), f"artifacts.paths=[{chain.parent}]")
    one_line_error(r, "artifacts.paths", "holds the model", code=2)
    assert sha256(chain) == before


@pytest.mark.parametrize("option", ["inputs", "replay.load"])
def test_summary_naming_an_input_file_is_refused_and_the_file_kept(run, tmp_path, chain, option):
    source = tmp_path / ("x.npz" if option == "inputs" else "replay.json")
    if option == "inputs":
        np.savez(source, x=np.ones((1, 4), np.float32))
        args = ["checker=compare", f"model={chain}", "mode=reduce", f"inputs={source}"]
    else:
        first = run(*reduce_args(chain, "n3"))
        source.write_bytes((first.run_dir / "replay.json").read_bytes())
        args = [*reduce_args(chain, "n3"), f"replay.load={source}"]
    before = sha256(source)
    r = run(*args, f"summary={source}")
    one_line_error(r, f"summary={source}", f"the {option}= file", code=2)
    assert sha256(source) == before


def test_two_outputs_naming_one_file_through_a_link_to_a_file_not_yet_made_are_refused(run, tmp_path, chain):
    target = tmp_path / "later.json"
    link = tmp_path / "link.onnx"
    link.symlink_to(target)
    r = run(*reduce_args(chain, "n3"), f"output={link}", f"replay.save={target}")
    one_line_error(r, "both name", code=2)
    assert not target.exists()


def test_a_run_directory_holding_a_finished_run_is_refused_unless_reused(run, tmp_path, chain):
    first = run(*reduce_args(chain, "n3"), "output=a.onnx")
    assert first.returncode == 0
    replay = (first.run_dir / "replay.json").read_bytes()
    again = run(*reduce_args(chain, "n3"), "output=b.onnx", run_dir=first.run_dir)
    one_line_error(again, "holds a finished run", "reuse_run_dir=true", code=2)
    assert (first.run_dir / "replay.json").read_bytes() == replay
    reused = run(*reduce_args(chain, "n3"), "output=c.onnx", "reuse_run_dir=true", run_dir=first.run_dir)
    assert reused.returncode == 0, reused.stderr[-2000:]


@pytest.mark.parametrize("flip", range(6))
@pytest.mark.slow
def test_a_replay_with_one_flipped_verdict_never_ends_ok_with_a_passing_answer(run, tmp_path, chain, flip):
    first = run(*reduce_args(chain, "n3"), "output=a.onnx")
    data = json.loads((first.run_dir / "replay.json").read_text())
    entries = [e for e in data["iterations"] if not e["key"].endswith(":answer")]
    if flip >= len(entries):
        pytest.skip(f"the run took {len(entries)} search checks")
    entries[flip]["passed"] = not entries[flip]["passed"]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps({**data, "iterations": entries}))
    resumed = run(*reduce_args(chain, "n3"), "output=b.onnx", f"replay.load={edited}")
    s = resumed.summary
    if resumed.returncode == 0:
        assert s["answer_verified"]["check_passed"] is False, "an ok answer still fails its own check"
    else:
        assert resumed.returncode in (2, 3), resumed.stderr[-2000:]
        assert s["status"] in ("answer not verified", "check never passed") or s["status"].startswith("error")


def _limited(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _one_error_under_a_file_limit(argv: list, cwd: Path, limit: int) -> str:
    """Run ``argv`` with files limited to ``limit`` bytes; assert exit 2 with one error line and no
    traceback, and return that line."""
    proc = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=_limited(limit), stdin=subprocess.DEVNULL
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


@pytest.mark.slow
def test_a_file_size_limit_while_copying_the_first_candidate_is_one_line_and_leaves_nothing_partial(tmp_path):
    """The classifier (585 KB) cannot be copied as iteration 1's artifact under a 100 KB file limit (as on a
    full disk): one error line, exit 2, a summary with the error, no partial artifact, the model untouched."""
    model = need(CLASSIFIER)
    before = sha256(model)
    argv = [
        sys.executable,
        "-m",
        "runner",
        "mode=reduce",
        f"model={model}",
        "model_input_shapes={x:[1,3,48,192]}",
        *python_check("HardSigmoid@2"),
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    error = _one_error_under_a_file_limit(argv, ROOT, 100_000)
    assert "iteration 1's artifact" in error and "File too large" in error
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"].startswith("error: cannot write iteration 1's artifact")
    assert not (tmp_path / "run" / "iter_artifact.onnx").exists()
    assert sha256(model) == before


def test_a_negative_seed_is_a_one_line_error(run, chain):
    one_line_error(run(*reduce_args(chain, "n3"), "seed=-1"), "seed=-1", "non-negative", code=2)


def test_layerwise_on_a_graph_without_nodes_is_a_one_line_error_and_writes_no_replay(run, tmp_path):
    graph = helper.make_graph(
        [],
        "empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(graph), path)
    r = run("mode=layerwise", f"model={path}")
    line = one_line_error(r, "no nodes that compute", code=2)
    assert "onnxruntime_src" not in line and "replay" not in r.summary


def test_a_path_in_a_shell_script_is_quoted_for_the_shell(tmp_path):
    folder = tmp_path / "$(touch pwned)"
    folder.mkdir()
    artifact = str(folder / "a.onnx")
    for script in ("test -f {artifact}", 'test -f "{artifact}"'):
        argv = substitute(["sh", "-c", script + " || exit 0; exit 1"], artifact, "0")
        (folder / "a.onnx").write_bytes(b"")
        assert subprocess.run(argv, cwd=tmp_path).returncode == 1, "the file was found under its real name"
    assert not (tmp_path / "pwned").exists()
    assert substitute(["python", "check.py", "{artifact}"], artifact, "0")[2] == artifact, "no shell: as it is"


def test_external_data_files_follow_the_umask(tmp_path):
    from runner.graph.load import save_model

    w = numpy_helper.from_array(np.ones(256, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])],
        [w],
    )
    old = os.umask(0o022)
    try:
        save_model(helper.make_model(graph), tmp_path / "m.onnx", external_data=True, threshold=16)
    finally:
        os.umask(old)
    assert (tmp_path / "m.onnx.data").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"], "no staging folder left"


@pytest.mark.slow
def test_two_re_runs_from_one_snapshot_started_together_get_their_own_directories(
    run_cli, tmp_path, chain, has_nodes_script
):
    """A snapshot holds no hydra section: its re-runs still get microsecond run directories, never one
    shared second (the second would be refused, blaming a hydra.run.dir the user never set)."""
    first = run_cli(*reduce_args(chain, "n3", script=has_nodes_script), "output=a.onnx")
    assert first.returncode == 0, first.stderr[-2000:]
    snapshot = first.run_dir / ".hydra"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runner", "-cp", str(snapshot), "-cn", "config", f"output={tmp_path / f'{i}.onnx'}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    dirs = sorted((tmp_path / "outputs").glob("*/*"))
    assert len(dirs) == 2 and all(len(d.name.split("-")) == 5 for d in dirs), dirs  # HH-MM-SS-micro-id


def _runner_argv(*args: str) -> list:
    return [sys.executable, "-m", "runner", *args]


@pytest.mark.slow
def test_a_replay_that_cannot_be_rewritten_is_one_line_and_keeps_its_verdicts(tmp_path, has_nodes_script):
    """Under an 8000-byte file limit (above Hydra's own config files) a 40-node chain's artifacts fit but
    the replay of its linear search outgrows it: one error line naming the replay, and the replay on disk
    still holds the verdicts before (it is replaced whole)."""
    chain = tmp_path / "long.onnx"
    onnx.save(chain_model(40), chain)
    run_dir = tmp_path / "run"
    argv = _runner_argv(*reduce_args(chain, "n3", script=has_nodes_script), "marker=linear", f"hydra.run.dir={run_dir}")
    error = _one_error_under_a_file_limit(argv, tmp_path, 8000)
    assert "cannot rewrite the replay" in error and "replay.load=" in error
    kept = json.loads((run_dir / "replay.json").read_text())["iterations"]
    assert kept and all(isinstance(e["passed"], bool) for e in kept)
    assert not list(run_dir.glob(".replay.json.*")), "no temporary file left"


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs (root and mount rights needed; skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("fill_kb", [2000, 1500, 1000])
def test_a_full_disk_at_any_point_is_one_line_with_a_summary_and_nothing_partial(small_disk, fill_kb):
    """The quick start's reduce with its run directory and kept intermediates on a nearly full disk: it
    either finishes or stops with one error line (exit 2), a summary with the error, a loadable replay,
    no partial artifact or intermediate; the model untouched."""
    model = need(CLASSIFIER)
    before = sha256(model)
    (small_disk / "fill").write_bytes(b"\0" * fill_kb * 1024)
    run_dir = small_disk / "run"
    argv = [*_quick_start_argv(small_disk), "artifacts.keep_intermediate=true"]  # output and run dir on the disk
    argv[argv.index(next(a for a in argv if a.startswith("model=")))] = f"model={model}"
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    if proc.returncode:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode == 2 and len(errors) == 1 and summary["status"].startswith("error"), proc.stderr[-2000:]
    else:
        assert summary["status"] == "ok"
    if (run_dir / "iter_artifact.onnx").exists():
        onnx.load(str(run_dir / "iter_artifact.onnx"))  # whole: a failed write leaves none
    if (run_dir / "replay.json").exists():
        json.loads((run_dir / "replay.json").read_text())
    for kept in (run_dir / "artifacts" / "intermediate").glob("*.onnx"):
        onnx.load(str(kept))  # whole, or not there
    assert sha256(model) == before
