"""Nothing silently wrong, round 4 (issue 54): options that compare nothing, checks that return no bool,
isolation's timeout, paths in shell scripts behind any program, time limits, malformed detections, API run
directories, truncated external data, Hydra's quotes, infinite ranges and NaN tolerances."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from examples.planted import one_sensitive, threshold_detector
from tests.helpers.cli import one_line_error
from tests.helpers.models import ROOT

FP16 = ["mode=precision", "marker=minimal", "checker=compare", "checker.backend=fp16_emulation"]


@pytest.fixture
def overflow(tmp_path):
    model, _, scale = one_sensitive()
    path, inputs = tmp_path / "overflow.onnx", tmp_path / "big.npz"
    onnx.save(model, path)
    np.savez(inputs, x=np.full((1, 8), 100 * scale, np.float32))
    return [f"model={path}", f"inputs={inputs}"]


@pytest.mark.parametrize(
    "options, words",
    [
        (["checker.exclude_outputs=[y]"], ["leaves none of the graph outputs"]),
        (["checker.outputs=[x]"], ["graph inputs ['x']", "compares nothing"]),
        (["checker.outputs=[y]", "checker.exclude_outputs=[y]"], ["leaves out ['y']", "name each tensor in one"]),
    ],
)
def test_options_that_compare_nothing_are_one_line_errors(run, overflow, options, words):
    """N1: each ended ok with 0 of 4 kept and "answer verified", where the written all-fp16 model gives Inf."""
    r = run(*FP16, *overflow, *options)
    one_line_error(r, *words, code=2)
    assert r.summary["checks"] == 0


@pytest.mark.parametrize(
    "what, kind",
    [("False", "str"), ("no", "str"), ("generator", "generator"), ("function", "builtin_function_or_method")],
)
def test_a_python_check_that_returns_no_bool_is_an_error_naming_its_type(run, chain, what, kind):
    """N2: "False", "no", a generator and ``len`` are truthy: they counted as passes."""
    check = ["checker=python", "checker.target=tests.helpers.checks.returns", f"checker.args=[{what}]"]
    r = run("mode=reduce", f"model={chain}", *check)
    one_line_error(r, f"returned {kind}", "not a bool", code=2)


def test_a_python_check_that_passes_the_model_names_its_function_not_fail_codes(run, chain):
    check = ["checker=python", "checker.target=tests.helpers.checks.lacks_nodes", "checker.args=[no_such_node]"]
    r = run("mode=reduce", f"model={chain}", *check)
    line = one_line_error(r, "no failure to reduce", "checker.target returns False", code=2)
    assert "fail_codes" not in line


@pytest.mark.slow  # a child process started per run
def test_an_isolated_timeout_counts_the_check_not_the_childs_start(run, chain):
    """N3: at 0.3 s every 2 ms check timed out (the child's start-up counted) and the run ended "never passed"."""
    check = ["checker=python", "checker.target=tests.helpers.checks.lacks_nodes", "checker.args=[n5]"]
    r = run("mode=reduce", f"model={chain}", *check, "checker.isolate=true", "checker.timeout_s=0.3")
    assert r.returncode == 0, r.stdout[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["n5"]
    assert "timed out" not in (r.run_dir / "runner.log").read_text() and "timeout after" not in str(r.replay)


@pytest.mark.parametrize(
    "prefix",
    [
        ["timeout", "-s", "KILL", "60", "sh", "-c"],
        ["env", "-u", "HOME", "sh", "-c"],
        ["stdbuf", "-o", "L", "sh", "-c"],
        ["xargs", "-a", "/dev/null", "sh", "-c"],
        ["flock", "lockfile", "sh", "-c"],
    ],
)
def test_a_path_in_a_shell_script_behind_any_program_is_quoted(tmp_path, prefix):
    """N4: a program whose options take values, or that no list held, put the path into the script as is."""
    from runner.checkers.command import substitute

    folder = tmp_path / "$(touch PWN6)"
    folder.mkdir()
    (folder / "a.onnx").write_bytes(b"")
    argv = substitute([*prefix, "test -f {artifact} || exit 0; exit 1"], str(folder / "a.onnx"), "0")
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, stdin=subprocess.DEVNULL)
    assert done.returncode in (1, 123), (argv, done.stderr)  # xargs says 123 for a command that exited 1
    assert not (tmp_path / "PWN6").exists()


@pytest.mark.parametrize("value", ["1e12", "1e400"])
def test_a_time_limit_past_what_can_be_waited_is_no_limit(run, chain, value):
    r = run("mode=repeat", "until=1", f"model={chain}", "checker.cmd=true", f"checker.timeout_s={value}")
    assert r.returncode == 0 and r.summary["good"] == 1, r.stdout[-2000:]
    one_line_error(
        run("mode=repeat", "until=1", f"model={chain}", "checker.cmd=true", "checker.timeout_s=nan"),
        "checker.timeout_s=nan",
        "above 0",
        code=2,
    )


@pytest.fixture
def detector(tmp_path):
    model, x = threshold_detector()
    path, inputs = tmp_path / "detector.onnx", tmp_path / "x.npz"
    onnx.save(model, path)
    np.savez(inputs, x=x)
    return [f"model={path}", f"inputs={inputs}"]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("{boxes: scores, scores: boxes}", ["are the two names swapped"]),
        ("{boxes: boxes}", ["no scores= tensor name"]),
        ("{boxes: boxes, scores: scores, score_atol: abc}", ["score_atol='abc' is not a number"]),
        ("[a,b]", ["is no map of tensor names"]),
        ("abc", ["is no map of tensor names"]),
    ],
)
def test_malformed_detections_are_one_line_errors(run, detector, spec, words):
    one_line_error(run(*FP16, *detector, f"checker.detections={spec}"), *words, code=2)


def test_api_run_dirs_that_cannot_be_one_are_api_errors(tmp_path, chain):
    from runner import api
    from runner.api import ApiError

    afile = tmp_path / "afile"
    afile.write_text("x")
    for run_dir, words in (("", "run_dir is empty"), (afile / "sub", "sits under one"), (afile, "is a file")):
        with pytest.raises(ApiError, match=words):
            api.repeat(chain, "true", until=1, run_dir=run_dir)


def test_truncated_external_data_is_named_as_such(run, tmp_path):
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", 1, [1, 64])],
        [helper.make_tensor_value_info("y", 1, [1, 64])],
        [weight],
    )
    path = tmp_path / "ext.onnx"
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, location="ext.data", size_threshold=0)
    with open(tmp_path / "ext.data", "r+b") as f:
        f.truncate(100)
    r = run(*FP16, f"model={path}")
    one_line_error(r, "its external data does not hold what the model names", "truncated", code=2)


@pytest.mark.slow  # a process of its own (the error is composition's, before any run)
def test_a_value_hydra_cannot_read_is_told_hydras_quotes(run_cli, tmp_path):
    r = run_cli("mode=repeat", "until=1", "model=par(en).onnx", "checker.cmd=true")
    one_line_error(r, "quote the value for Hydra", """'model="par(en).onnx"'""", code=2)


@pytest.mark.slow  # a process of its own
def test_a_file_size_limit_on_hydras_own_writes_is_one_line(tmp_path, chain):
    """``ulimit -f 1``: Hydra's config snapshot could not be written, and a traceback said so."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)); "
        "import sys, runpy; sys.argv = ['runner'] + sys.argv[1:]; runpy.run_module('runner', run_name='__main__')"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "mode=repeat",
            "until=1",
            f"model={chain}",
            "checker.cmd=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "ulimit -f" in done.stderr


@pytest.mark.parametrize(
    "option, words",
    [("val_range=[0,inf]", ["val_range=[0.0, inf]", "finite bounds"]), ("checker.rtol=nan", ["checker.rtol=nan"])],
)
def test_values_that_test_nothing_are_refused(run, overflow, option, words):
    """val_range=[0,inf] drew only Inf inputs; rtol=nan kept every node; both ended ok."""
    args = [a for a in overflow if not a.startswith("inputs=")] if option.startswith("val_range") else overflow
    one_line_error(run(*FP16, *args, option), *words, code=2)
