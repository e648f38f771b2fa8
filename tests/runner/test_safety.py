"""Nothing of the user's is lost and no run is silently wrong: output safety, run isolation, replay
identity, check sanity, subprocess robustness, the user's model first. Through the CLI, as a user
meets them."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.helpers.checks import python_check
from tests.helpers.cli import check_cmd, one_line_error, write_script
from tests.helpers.models import chain_model


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def chain(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(chain_model(8), path)
    return path


def _reduce_args(model, script, *culprits):
    """A reduce whose check fails while the model holds the culprits: the command ``script``, else in-process."""
    check = [check_cmd(script, "{artifact}", *culprits)] if script else python_check(*culprits)
    return ["mode=reduce", f"model={model}", *check]


# -- output safety ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["output", "min_good", "artifacts.iter_artifact", "summary", "replay.save", "artifacts.iter_info"]
)
@pytest.mark.parametrize("spelling", ["absolute", "dot", "symlink", "hardlink"])
def test_no_option_may_name_the_model(run, tmp_path, chain, has_nodes_script, option, spelling):
    before = _sha(chain)
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
    r = run(*_reduce_args(chain, None, "n3"), f"{option}={target}")
    one_line_error(r, f"{option}=", "would overwrite the model", str(chain), code=2)
    assert _sha(chain) == before
    assert r.summary["checks"] == 0


def test_save_golden_and_precision_output_may_not_name_the_model(run, tmp_path, chain):
    before = _sha(chain)
    r = run("mode=reduce", f"model={chain}", "checker=compare", f"save_golden={chain}")
    one_line_error(r, "save_golden=", "would overwrite the model", code=2)
    r = run(
        "mode=precision", f"model={chain}", "checker=compare", "checker.backend=fp16_emulation", "output=./model.onnx"
    )
    one_line_error(r, "output=", "would overwrite the model", code=2)
    assert _sha(chain) == before


def test_external_data_file_is_protected(run, tmp_path, has_nodes_script):
    model = chain_model(8)
    model.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "unused_w"))
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="out.onnx.data", size_threshold=0)
    data = tmp_path / "out.onnx.data"
    before = _sha(data)
    r = run(*_reduce_args(path, None, "n3"), f"output={tmp_path / 'out.onnx'}", "external_data=true")
    one_line_error(r, "output=", "external data file", str(data), code=2)
    r = run(*_reduce_args(path, None, "n3"), f"summary={data}")
    one_line_error(r, "summary=", "external data file", code=2)
    assert _sha(data) == before


def test_reduce_again_with_the_default_output_picks_a_free_name(run, tmp_path, has_nodes_script):
    onnx.save(chain_model(8), tmp_path / "reduced.onnx")
    before = _sha(tmp_path / "reduced.onnx")
    r = run(*_reduce_args("reduced.onnx", None, "n3"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert _sha(tmp_path / "reduced.onnx") == before
    assert r.summary["output"] == str(tmp_path / "reduced_1.onnx")
    assert [n.name for n in onnx.load(str(tmp_path / "reduced_1.onnx")).graph.node if n.op_type != "Constant"] == ["n3"]
    assert "reduced.onnx exists; writing output=" in r.stdout + r.stderr


def test_two_options_naming_one_file(run, tmp_path, chain, has_nodes_script):
    r = run(*_reduce_args(chain, None, "n3"), "output=same.onnx", "min_good=same.onnx")
    one_line_error(r, "min_good and output both name", code=2)


@pytest.mark.parametrize("option", ["output", "min_good", "replay.save", "artifacts.iter_info", "summary"])
def test_unwritable_output_stops_before_the_first_check(run, tmp_path, chain, has_nodes_script, option):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    r = run(*_reduce_args(chain, None, "n3"), f"{option}={blocker / 'sub' / 'x.json'}")
    one_line_error(r, f"{option}=", code=2)
    assert not (r.run_dir / "checks").exists(), "no check ran"


def test_unwritable_run_dir_is_one_line(tmp_path, chain, has_nodes_script):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cmd = [
        sys.executable,
        "-m",
        "runner",
        *_reduce_args(chain, has_nodes_script, "n3"),
        f"hydra.run.dir={blocker / 'run'}",
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    one_line_error(r, "hydra.run.dir=", "not a writable directory", code=2)


def test_files_get_the_users_umask(tmp_path, chain, has_nodes_script):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "runner", *_reduce_args(chain, has_nodes_script, "n3"), f"hydra.run.dir={run_dir}"]
    r = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o027)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("summary.json", "replay.json"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o640, name


# -- run isolation ------------------------------------------------------------------------------


SLOW_HAS_NODES = """
import sys, time, onnx
time.sleep(float(sys.argv[2]))
names = {n.name for n in onnx.load(sys.argv[1], load_external_data=False).graph.node}
sys.exit(1 if all(x in names for x in sys.argv[3:]) else 0)
"""


def _start(tmp_path, *args, run_dir=None):
    extra = [f"hydra.run.dir={run_dir}"] if run_dir else []
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args, *extra],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def test_two_runs_started_together_give_their_own_answers(tmp_path, chain):
    """Default run directories and default output names: each run gets its own, and its own answer."""
    script = write_script(tmp_path / "slow.py", SLOW_HAS_NODES)
    runs = {
        c: _start(tmp_path, "mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", "0.05", c))
        for c in ("n2", "n5")
    }
    outputs = {}
    for culprit, proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        replay_line = next(line for line in out.splitlines() if line.startswith("replay"))
        summary = json.loads((Path(replay_line.split()[-1]).parent / "summary.json").read_text())
        assert [n["name"] for n in summary["reduced_nodes"]] == [culprit]
        outputs[culprit] = summary["output"]
        names = [n.name for n in onnx.load(summary["output"]).graph.node if n.op_type != "Constant"]
        assert names == [culprit]
    assert len(set(outputs.values())) == 2
    assert {Path(p).name for p in outputs.values()} == {"reduced.onnx", "reduced_1.onnx"}


def test_a_run_directory_in_use_is_refused(tmp_path, chain):
    script = write_script(tmp_path / "slow.py", SLOW_HAS_NODES)
    run_dir = tmp_path / "shared_run"
    first = _start(
        tmp_path,
        "mode=reduce",
        f"model={chain}",
        check_cmd(script, "{artifact}", "0.3", "n3"),
        "output=a.onnx",
        run_dir=run_dir,
    )
    deadline = time.monotonic() + 60
    while not (run_dir / "checks").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = _start(
        tmp_path,
        "mode=reduce",
        f"model={chain}",
        check_cmd(script, "{artifact}", "0", "n5"),
        "output=b.onnx",
        run_dir=run_dir,
    )
    _out2, err2 = second.communicate(timeout=60)
    assert second.returncode == 2 and "in use by another running run" in err2, err2
    _out1, err1 = first.communicate(timeout=120)
    assert first.returncode == 0, err1[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [n["name"] for n in summary["reduced_nodes"]] == ["n3"]
    assert not (tmp_path / "b.onnx").exists()


# -- replay identity ----------------------------------------------------------------------------


def test_replay_of_another_check_model_or_shapes_is_refused(run, tmp_path, chain, has_nodes_script):
    first = run(*_reduce_args(chain, None, "n3"), "output=a.onnx")
    assert first.returncode == 0, first.stderr[-2000:]
    replay = first.run_dir / "replay.json"
    other_check = run(*_reduce_args(chain, None, "n5"), "output=b.onnx", f"replay.load={replay}")
    one_line_error(other_check, "replay.load=", "another check", "replay.force=true", code=2)
    edited = tmp_path / "edited.onnx"
    model = chain_model(8)
    model.graph.node[3].name = "n3"
    model.doc_string = "edited"
    onnx.save(model, edited)
    other_model = run(*_reduce_args(edited, None, "n3"), "output=c.onnx", f"replay.load={replay}")
    one_line_error(other_model, "model content", code=2)
    other_shapes = run(
        *_reduce_args(chain, None, "n3"), "output=d.onnx", f"replay.load={replay}", "model_input_shapes={x:[1,4]}"
    )
    one_line_error(other_shapes, "options (model_input_shapes)", code=2)
    forced = run(*_reduce_args(chain, None, "n5"), "output=e.onnx", f"replay.load={replay}", "replay.force=true")
    assert forced.returncode == 0 and forced.summary["checks"] == 0, "forced: every verdict reused"


def test_replay_after_the_check_script_changed_is_refused(run, tmp_path, chain):
    script = write_script(tmp_path / "check.py", SLOW_HAS_NODES)
    first = run("mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", "0", "n3"), "output=a.onnx")
    assert first.returncode == 0
    script.write_text(SLOW_HAS_NODES + "\n# fixed a bug\n")
    again = run(
        "mode=reduce",
        f"model={chain}",
        check_cmd(script, "{artifact}", "0", "n3"),
        "output=b.onnx",
        f"replay.load={first.run_dir / 'replay.json'}",
    )
    one_line_error(again, "another check", "files", code=2)


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"key": "k", "passed": "false"}, ['passed="false"', "true or false"]),
        ({"key": ["a", "b"], "passed": False}, ["key=", "a string"]),
        ({"key": "k", "passed": True, "returncode": "1"}, ["returncode="]),
        ({"passed": True}, ["lacks 'key'"]),
    ],
)
def test_replay_entries_of_the_wrong_type_are_errors(run, tmp_path, chain, has_nodes_script, entry, words):
    first = run(*_reduce_args(chain, None, "n3"), "output=a.onnx")
    data = json.loads((first.run_dir / "replay.json").read_text())
    data["iterations"].append(entry)
    bad = tmp_path / "bad_replay.json"
    bad.write_text(json.dumps(data))
    r = run(*_reduce_args(chain, None, "n3"), "output=b.onnx", f"replay.load={bad}")
    one_line_error(r, "replay.load=", *words, code=2)


def test_replay_nested_too_deeply(run, tmp_path, chain, has_nodes_script):
    bad = tmp_path / "deep.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(run(*_reduce_args(chain, None, "n3"), f"replay.load={bad}"), "replay.load=", code=2)


# -- check sanity -------------------------------------------------------------------------------


def test_a_check_that_never_passes_is_not_a_culprit(run, tmp_path, chain):
    r = run(
        "mode=reduce", f"model={chain}", f'checker.cmd="{sys.executable} {tmp_path / "missing_script.py"} {{artifact}}"'
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "check never passed" in r.stderr and "Traceback" not in r.stderr
    assert "missing_script.py" in r.stderr, "the last check's output is shown"
    s = r.summary
    assert s["status"] == "check never passed"
    assert "missing_script.py" in s["check_output_tail"]
    assert "reduced_nodes" not in s
    assert not (tmp_path / "reduced.onnx").exists(), "no answer written, and the reserved name released"


@pytest.mark.parametrize(
    "code, words", [(127, ["exited 127", "not found"]), (126, ["exited 126", "cannot be executed"])]
)
def test_exit_126_and_127_stop_at_the_first_check(run, chain, code, words):
    r = run("mode=reduce", f"model={chain}", f"checker.cmd=\"bash -c 'echo oops; exit {code}'\"")
    one_line_error(r, *words, "oops", code=2)
    assert r.summary["checks"] == 1


def test_the_culprit_first_in_order_is_still_found(run, tmp_path, chain, has_nodes_script):
    """No search candidate passes when the culprit is the first node: a control check shows the check can pass."""
    r = run(*_reduce_args(chain, None, "n0"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["n0"]
    labels = [e["label"] for e in r.replay["iterations"]]
    assert any(label.startswith("control") for label in labels)


KILLED = """
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_check_killed_by_a_signal(run, tmp_path):
    script = write_script(tmp_path / "oom.py", KILLED)
    r = run("mode=repeat", "until=3", check_cmd(script))
    one_line_error(r, "killed by SIGKILL", "out of memory?", "checker.signal_is=fail", code=2)
    r = run("mode=repeat", "until=3", check_cmd(script), "checker.signal_is=fail")
    assert r.returncode == 0 and r.summary["bad"] == 3
    assert r.replay["iterations"][0]["reason"] == "killed by SIGKILL (out of memory?)"


# -- subprocess robustness ----------------------------------------------------------------------


BACKGROUND_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
sys.exit(1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(") ")[-1][0] != "Z"


def test_background_child_does_not_delay_the_verdict(run, tmp_path):
    script = write_script(tmp_path / "bg.py", BACKGROUND_CHILD)
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    r = run("mode=repeat", "until=1", check_cmd(script, str(pid_file)), "checker.timeout_s=30")
    assert time.monotonic() - started < 30
    assert r.returncode == 0 and r.summary["bad"] == 1
    assert r.replay["iterations"][0]["reason"] == "exit code 1", "a false FAIL by timeout would say timeout"
    time.sleep(0.2)
    assert not _alive(int(pid_file.read_text())), "the background child is ended with the check's process group"


def test_big_check_output_is_capped_in_the_log(run, tmp_path):
    script = write_script(
        tmp_path / "loud.py", "import sys\nsys.stdout.write('x' * 10_000_000 + '\\nLAST LINE\\n')\nsys.exit(1)\n"
    )
    r = run("mode=repeat", "until=1", check_cmd(script))
    assert r.returncode == 0
    log = (r.run_dir / "runner.log").read_text()
    assert len(log) < 50_000 and "LAST LINE" in log
    assert len(r.stdout) < 50_000
    whole = r.run_dir / "checks" / "iter1.log"
    assert whole.stat().st_size > 10_000_000 and "checks/iter1.log" in log


SLEEPER = """
import os, sys, time
open(sys.argv[1], "a").write(f"{os.getpid()}\\n")
time.sleep(60)
"""


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_signals_end_the_run_like_ctrl_c(tmp_path, sig, code):
    import signal as signal_module

    script = write_script(tmp_path / "sleeper.py", SLEEPER)
    pids = tmp_path / "pids.txt"
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, "mode=repeat", "until=3", check_cmd(script, str(pids)), run_dir=run_dir)
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(getattr(signal_module, sig))
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    time.sleep(0.2)
    assert not any(_alive(int(p)) for p in pids.read_text().split())


def test_check_dies_with_a_killed_runner(tmp_path):
    import signal as signal_module

    script = write_script(tmp_path / "sleeper.py", SLEEPER)
    pids = tmp_path / "pids.txt"
    proc = _start(tmp_path, "mode=repeat", "until=3", check_cmd(script, str(pids)), run_dir=tmp_path / "run")
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal_module.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(int(p)) for p in pids.read_text().split()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(int(p)) for p in pids.read_text().split())


def test_closed_stdout_is_quiet(tmp_path, chain, has_nodes_script):
    cmd = [
        sys.executable,
        "-m",
        "runner",
        *_reduce_args(chain, has_nodes_script, "n3"),
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "ok"


# -- the user's model first ---------------------------------------------------------------------


NEEDS_A_CONSTANT_NODE = """
import sys, onnx
nodes = onnx.load(sys.argv[1]).graph.node
has = {n.name for n in nodes}
sys.exit(1 if "const" in has and "n3" in has else 0)
"""


def test_a_failure_that_needs_constant_nodes_keeps_them(run, tmp_path, chain):
    script = write_script(tmp_path / "needs_const.py", NEEDS_A_CONSTANT_NODE)
    r = run("mode=reduce", f"model={chain}", check_cmd(script, "{artifact}"))
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.replay["iterations"][0]
    assert first["label"].startswith("your model as given") and first["passed"] is False
    assert "the failure needs Constant nodes" in r.stdout + r.stderr
    assert r.summary["keep_constant_nodes"] is True
    names = [n.name for n in onnx.load(r.summary["output"]).graph.node]
    assert "n3" in names and "const" in names


def test_iteration_one_checks_a_byte_copy_of_the_users_file(run, tmp_path, chain):
    script = write_script(
        tmp_path / "same.py",
        f'''
import hashlib, os, sys
same = hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest() == "{_sha(chain)}"
open(sys.argv[2], "a").write(f"{{os.environ['RUNNER_ITERATION']}} {{same}}\\n")
sys.exit(1 if same or os.environ["RUNNER_ITERATION"] != "1" else 0)
''',
    )
    log = tmp_path / "seen.txt"
    run("mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", str(log)))
    assert log.read_text().splitlines()[0] == "1 True"
