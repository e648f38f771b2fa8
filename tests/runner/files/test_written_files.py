"""One rule for every file a run writes: it never replaces a file that no run of this tool wrote for the same key
(unless ``overwrite=true``), it writes the ``_1`` name instead and says so in one line, and a write aimed at a
file the run reads is refused before any work (``runner.files.outputs``, ``runner.files.ledger``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

from runner.files.ledger import LEDGER, record, written_for
from runner.files.samples import save_input_samples
from tests.helpers.checks import reduce_args
from tests.helpers.cli import one_line_error
from tests.helpers.int8 import conv_outlier_model, samples
from tests.helpers.models import sha256


def _nodes(path):
    return [n.name for n in onnx.load_model(str(path), format="protobuf").graph.node if n.op_type != "Constant"]


def test_an_existing_user_file_named_as_an_artifact_gets_the_1_name(run, tmp_path, chain):
    """Was: ``artifacts.iter_artifact=has.py`` naming a user's script replaced it with an ONNX candidate, exit 0."""
    script = tmp_path / "has.py"
    script.write_text("print('my own script')\n")
    before = sha256(script)
    r = run(*reduce_args(chain, "n3"), "artifacts.iter_artifact=has.py")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sha256(script) == before, "the user's file is untouched"
    log = r.stdout + r.stderr
    assert "artifacts.iter_artifact=" in log and "no run of this tool wrote it" in log and "has_1.py" in log


def test_an_output_naming_another_runs_replay_gets_the_1_name(run, tmp_path, chain):
    """Was: ``output=`` naming another run's ``replay.json`` replaced it, exit 0."""
    first = run(*reduce_args(chain, "n3"), "output=first.onnx")
    assert first.returncode == 0, first.stderr[-2000:]
    replay = first.run_dir / "replay.json"
    before = sha256(replay)
    r = run(*reduce_args(chain, "n3"), f"output={replay}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sha256(replay) == before and json.loads(replay.read_text())["mode"] == "reduce"
    assert r.summary["output"] == str(first.run_dir / "replay_1.json")
    assert _nodes(first.run_dir / "replay_1.json") == ["n3"]


def test_an_output_this_tool_wrote_for_the_same_key_is_replaced_and_an_edited_one_is_not(run, tmp_path, chain):
    """The documented re-run: ``output=fixed.onnx`` twice replaces the first answer; once a person has
    changed the file it is theirs, and a file written for another key is never taken for this one."""
    first = run(*reduce_args(chain, "n3"), "output=fixed.onnx")
    assert first.returncode == 0 and written_for(tmp_path / "fixed.onnx") == "output"
    again = run(*reduce_args(chain, "n5"), "output=fixed.onnx")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.summary["output"] == str(tmp_path / "fixed.onnx") and _nodes(tmp_path / "fixed.onnx") == ["n5"]

    (tmp_path / "fixed.onnx").write_bytes((tmp_path / "fixed.onnx").read_bytes())  # edited by hand: new mtime
    (tmp_path / "fixed.onnx").touch()
    edited = sha256(tmp_path / "fixed.onnx")
    third = run(*reduce_args(chain, "n3"), "output=fixed.onnx")
    assert third.summary["output"] == str(tmp_path / "fixed_1.onnx") and sha256(tmp_path / "fixed.onnx") == edited

    other_key = run(*reduce_args(chain, "n3"), "min_good=fixed_1.onnx", "output=x.onnx")
    assert other_key.returncode == 0
    assert "was written by an earlier run for output=, not min_good=" in other_key.stdout + other_key.stderr
    assert _nodes(tmp_path / "fixed_1.onnx") == ["n3"], "the answer written for output= stays"


def test_overwrite_true_replaces_a_named_file_but_never_one_the_run_reads(run, tmp_path, chain):
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(b"not a model")
    r = run(*reduce_args(chain, "n3"), "output=mine.onnx", "overwrite=true")
    assert r.returncode == 0 and r.summary["output"] == str(mine) and _nodes(mine) == ["n3"]
    before = sha256(chain)
    r = run(*reduce_args(chain, "n3"), f"output={chain}", "overwrite=true")
    one_line_error(r, "would overwrite the model", code=2)
    assert sha256(chain) == before


@pytest.mark.slow
def test_runs_started_together_with_one_output_each_write_their_own(tmp_path, chain):
    """Was: three runs with one ``output=red.onnx`` each all reported it as their answer. The runs' first checks
    wait for each other (named by the run directory their artifact lies in; a run plans its outputs before its
    first check), so all three are under way together however slowly a loaded machine starts them: a run that
    starts after another has ended may rightly replace that run's answer (the ledger's rule), which made this test
    fail once in a full suite beside other work."""
    from tests.helpers.cli import HAS_NODES, write_script

    arrived = tmp_path / "arrived"
    arrived.mkdir()
    barrier = (
        "import os, sys, time\n"
        f"arrived = {str(arrived)!r}\n"
        f"run = os.path.relpath(os.path.abspath(sys.argv[1]), {str(tmp_path)!r}).split(os.sep)[0]\n"
        "open(os.path.join(arrived, run), 'w').close()\n"
        "deadline = time.monotonic() + 90\n"
        "while len(os.listdir(arrived)) < 3 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    script = write_script(tmp_path / "has_nodes_together.py", barrier + HAS_NODES)
    args = [sys.executable, "-m", "runner", *reduce_args(chain, "n3", script=script), "output=red.onnx"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen([*args, f"hydra.run.dir={tmp_path / f'r{i}'}"], cwd=tmp_path, **pipes) for i in range(3)]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    assert sorted(p.name for p in arrived.iterdir()) == ["r0", "r1", "r2"], "each run's first check waited for all"
    outputs = {json.loads((tmp_path / f"r{i}" / "summary.json").read_text())["output"] for i in range(3)}
    assert outputs == {str(tmp_path / n) for n in ("red.onnx", "red_1.onnx", "red_2.onnx")}
    assert all(_nodes(tmp_path / n) == ["n3"] for n in ("red.onnx", "red_1.onnx", "red_2.onnx"))


def test_the_ledger_counts_a_file_as_ours_only_while_it_is_the_one_written(tmp_path):
    path = tmp_path / "a.onnx"
    path.write_bytes(b"x")
    assert written_for(path) is None
    record({path: "output"})
    assert written_for(path) == "output"
    path.write_bytes(b"yy")
    assert written_for(path) is None, "changed since"
    (tmp_path / LEDGER).write_text("{ half written")
    assert written_for(path) is None, "an unreadable ledger is an empty one"
    record({path: "output"})
    assert written_for(path) == "output" and json.loads((tmp_path / LEDGER).read_text())["files"]["a.onnx"]


def _int8_args(tmp_path):
    model = tmp_path / "conv.onnx"
    onnx.save(conv_outlier_model(), model)
    data = tmp_path / "samples.json"
    save_input_samples(data, list(samples()))
    return model, ["mode=precision", f"model={model}", "checker=compare", "low_precision=int8", f"inputs={data}"]


def test_an_output_naming_the_calibration_cache_is_refused(run, tmp_path):
    """Was: ``calibration.cache=cal.json output=cal.json`` replaced the cache the run had just read, then ended
    "not an ONNX model"."""
    _, args = _int8_args(tmp_path)
    cache = tmp_path / "cal.json"
    first = run(*args, f"calibration.cache={cache}", "output=answer.onnx", "marker=bisect")
    assert cache.is_file(), first.stderr[-2000:]
    before = sha256(cache)
    r = run(*args, f"calibration.cache={cache}", f"output={cache}", "marker=bisect")
    one_line_error(r, "output=", "would overwrite the calibration.cache= file", code=2)
    assert sha256(cache) == before and r.summary["checks"] == 0
    fresh = tmp_path / "new.json"
    r = run(*args, f"calibration.cache={fresh}", f"output={fresh}", "marker=bisect")
    one_line_error(r, "both name", code=2)
    assert not fresh.exists()


@pytest.mark.parametrize("which", ["model", "link", "loader"])
def test_a_calibration_cache_naming_a_file_the_run_reads_is_refused_by_name(run, tmp_path, which):
    """Was: "cannot be read ...; delete it or name another", inviting the user to delete the model."""
    model = tmp_path / "conv.onnx"
    onnx.save(conv_outlier_model(), model)
    loader = tmp_path / "loader.py"
    loader.write_text(
        "import numpy as np\ndef load():\n    for i in range(4):\n"
        "        yield {'x': np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)}\n"
    )
    (tmp_path / "link.onnx").symlink_to(model)
    cache = {"model": model, "link": tmp_path / "link.onnx", "loader": loader}[which]
    before = sha256(cache)
    r = run(
        "mode=precision", f"model={model}", "checker=compare", "low_precision=int8", f"data_loader={loader}:load",
        f"calibration.cache={cache}",
    )  # fmt: skip
    what = "the module of" if which == "loader" else "is the model"
    error = one_line_error(r, f"calibration.cache={cache}", what, "which this run reads", code=2)
    assert "delete" not in error and sha256(cache) == before


def test_a_loader_that_never_ends_is_read_to_its_cap(run, tmp_path, chain):
    loader = tmp_path / "endless.py"
    loader.write_text(
        "import numpy as np\ndef load():\n    while True:\n        yield {'x': np.ones((1, 4), np.float32)}\n"
    )
    r = run(
        "mode=repeat", "until=1", f"model={chain}", "checker=compare", f"data_loader={loader}:load",
        "data_loader_max_samples=7",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "yields more than 7 samples (data_loader_max_samples=N reads up to N); the run uses the first 7" in (
        r.stdout + r.stderr
    )
    assert np.isfinite(r.summary["wall_s"])


def test_a_loader_of_large_samples_is_read_to_its_memory_bound(run, tmp_path, chain):
    """Issue 74: an endless image loader read 1,000 samples of 1.2 MB and the run was killed at 12 GB."""
    loader = tmp_path / "pages.py"
    loader.write_text(  # 1 MiB a sample: an image loader's
        "import numpy as np\ndef load():\n    while True:\n        yield {'x': np.ones((1, 4), np.float32), "
        "'pixels': np.zeros(2**18, np.float32)}\n"
    )
    r = run(
        "mode=repeat", "until=1", f"model={chain}", "checker=compare", f"data_loader={loader}:load",
        "data_loader_max_mb=3.5",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in (r.stdout + r.stderr).splitlines() if "yields more than" in x)
    assert "more than 3.5 MB of samples (1.00 MB each; data_loader_max_mb=N reads up to N MB)" in line
    assert line.endswith("the run uses the first 3")


@pytest.mark.parametrize("key", ["data_loader_max_samples=5", "data_loader_max_mb=8"])
def test_a_loader_bound_without_a_loader_is_one_line(run, chain, key):
    r = run("mode=repeat", "until=1", f"model={chain}", "checker=compare", key)
    one_line_error(r, key.split("=")[0], "no", "data_loader=", code=2)


@pytest.mark.parametrize("yielded", ["'text'", "np.array(['a', 'b'])", "[[1.0], [1.0, 2.0]]"])
def test_a_loader_yielding_no_numbers_is_one_line(run, tmp_path, chain, yielded):
    """Was ``ValueError: could not convert string to float`` as a traceback."""
    loader = tmp_path / "words.py"
    loader.write_text(f"import numpy as np\ndef load():\n    yield {{'x': {yielded}}}\n")
    r = run("mode=repeat", "until=1", f"model={chain}", "checker=compare", f"data_loader={loader}:load")
    one_line_error(r, "data_loader=", "x", code=2)


@pytest.mark.parametrize(
    "body, words",
    [
        ("import sys\nsys.exit(4)\n", "on import called sys.exit(4)"),
        ("raise KeyboardInterrupt\n", "on import raised KeyboardInterrupt"),
        ("def load():\n    raise SystemExit(3)\n", "its function called sys.exit(3)"),
        ("def load():\n    raise KeyboardInterrupt\n    yield\n", "its function raised KeyboardInterrupt"),
    ],
)
def test_a_loader_that_exits_is_one_line_naming_it(run, tmp_path, chain, body, words):
    """Was: ``sys.exit(4)`` on import ended the run with exit 4 and nothing printed."""
    loader = tmp_path / "bad_loader.py"
    loader.write_text(body)
    r = run("mode=repeat", "until=1", f"model={chain}", "checker=compare", f"data_loader={loader}:load")
    one_line_error(r, f"data_loader={loader}:load", words, code=2)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_a_run_reading_an_endless_loader_within_2_s(tmp_path, chain, sig, code):
    """Was: a loader that never ends was read forever, every sample held, and SIGTERM did not end it within 5 s."""
    loader = tmp_path / "endless.py"
    loader.write_text(
        "import numpy as np\ndef load():\n    while True:\n"
        "        yield {'x': np.random.rand(1, 4).astype(np.float32)}\n"
        "        np.random.rand(300, 300) @ np.random.rand(300, 300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "mode=repeat", "until=1", f"model={chain}", "checker=compare",
         f"data_loader={loader}:load", "data_loader_max_samples=100000000", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = ""
    while "samples read" not in line:  # the progress line (the log is on stdout): it is reading
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "the run ended before it read"
    start = time.monotonic()
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert time.monotonic() - start < 2.0 and proc.returncode == code
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "interrupted"
