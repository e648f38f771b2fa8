"""Bad input: one-line error naming the problem and the fix, non-zero exit, nothing of the user's lost."""

from __future__ import annotations

import hashlib

import onnx
import pytest

from tests.helpers.cli import check_cmd, one_line_error, write_script
from tests.helpers.models import chain_model


@pytest.fixture
def ok_script(tmp_path):
    return write_script(tmp_path / "ok.py", "import sys\nsys.exit(1)\n")


def test_missing_model(run, ok_script, tmp_path):
    r = run("mode=reduce", f"model={tmp_path / 'nope.onnx'}", check_cmd(ok_script))
    one_line_error(r, "no such file", "model=")
    assert r.summary["status"].startswith("error: ")


def test_a_directory_given_as_the_model(run, ok_script, tmp_path):
    (tmp_path / "exported").mkdir()
    r = run("mode=reduce", f"model={tmp_path / 'exported'}", check_cmd(ok_script))
    one_line_error(r, "is a directory", "give the model's .onnx file", code=2)


def test_not_onnx(run, ok_script, tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model\n" * 20)
    r = run("mode=reduce", f"model={bad}", check_cmd(ok_script))
    one_line_error(r, "not an ONNX model")
    assert bad.read_text() == "this is not a model\n" * 20


def test_no_model_given(run, ok_script):
    one_line_error(run("mode=reduce", check_cmd(ok_script)), "no model given", "model=")


def test_check_command_not_found(run, tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(chain_model(3), model)
    r = run("mode=reduce", f"model={model}", 'checker.cmd="no-such-program-xyz {artifact}"')
    one_line_error(r, "no-such-program-xyz", "not found")


def test_check_command_not_set(run):
    one_line_error(run("mode=repeat", "until=1"), "checker.cmd", "not set")


def test_artifacts_dir_not_writable(run, ok_script, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run(
        "mode=repeat", "until=1", check_cmd(ok_script), "artifacts.paths=[a.txt]", f"artifacts.dir={blocker / 'sub'}"
    )
    one_line_error(r, "artifacts.dir", "not a writable directory")


def test_an_output_whose_directory_takes_no_file_names_the_file_and_its_directory(run, chain, ok_script):
    """/proc exists and takes no new file, even for root: the error names output= as given, not as a directory."""
    r = run("mode=reduce", f"model={chain}", check_cmd(ok_script), "output=/proc/reduced.onnx")
    one_line_error(r, "output=/proc/reduced.onnx: its directory /proc is not writable", code=2)


@pytest.mark.parametrize(
    "until, words", [("0", ["until=0", "positive"]), ("-3", ["until=-3", "positive"]), ("soon", ["until='soon'"])]
)
def test_bad_until(run, ok_script, until, words):
    one_line_error(run("mode=repeat", f"until={until}", check_cmd(ok_script)), *words)


def test_missing_until(run, ok_script):
    one_line_error(run("mode=repeat", check_cmd(ok_script)), "until=")


@pytest.mark.slow  # a python -m runner process: about 1 s, over 1.5 s on a loaded 2-core machine
def test_unknown_key_fails_before_work(run_cli, ok_script, tmp_path):
    r = run_cli("mode=repeat", "until=1", check_cmd(ok_script), "colour=blue")
    assert r.returncode != 0
    assert "colour" in r.stderr
    assert not (r.run_dir / "replay.json").exists()


def test_bad_replay_file(run, ok_script, tmp_path):
    junk = tmp_path / "replay.json"
    junk.write_text("{}")
    one_line_error(run("mode=repeat", "until=1", check_cmd(ok_script), f"replay.load={junk}"), "not a replay file")


def test_nothing_to_reduce_when_original_passes(run, tmp_path, has_nodes_script):
    model = tmp_path / "m.onnx"
    onnx.save(chain_model(4), model)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    r = run("mode=reduce", f"model={model}", check_cmd(has_nodes_script, "{artifact}", "not_a_node"))
    one_line_error(r, "passes on the unreduced model")
    assert r.summary["checks"] == 1
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before


def test_both_reductions_off(run, tmp_path, has_nodes_script):
    model = tmp_path / "m.onnx"
    onnx.save(chain_model(4), model)
    r = run(
        "mode=reduce",
        f"model={model}",
        check_cmd(has_nodes_script, "{artifact}", "n1"),
        "reduce_inputs=false",
        "reduce_outputs=false",
    )
    one_line_error(r, "nothing to reduce")


def test_unknown_input_in_model_input_shapes(run, tmp_path, has_nodes_script):
    model = tmp_path / "m.onnx"
    onnx.save(chain_model(4), model)
    r = run(
        "mode=reduce",
        f"model={model}",
        check_cmd(has_nodes_script, "{artifact}", "n1"),
        "model_input_shapes={nope:[1]}",
    )
    one_line_error(r, "nope", "not a model input")


def _save_unchecked(path, nodes, inputs, outputs, inits=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_empty_graph(run, tmp_path, has_nodes_script):
    from tests.helpers.models import f32

    model = _save_unchecked(tmp_path / "empty.onnx", [], [f32("x", [1])], [f32("x", [1])])
    one_line_error(run("mode=reduce", f"model={model}", check_cmd(has_nodes_script, "{artifact}", "a")), "no nodes")


def test_cycle(run, tmp_path, has_nodes_script):
    from onnx import helper

    from tests.helpers.models import f32

    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Identity", ["b"], ["y"], name="out"),
    ]
    model = _save_unchecked(tmp_path / "cycle.onnx", nodes, [f32("x", [1])], [f32("y", [1])])
    one_line_error(run("mode=reduce", f"model={model}", check_cmd(has_nodes_script, "{artifact}", "second")), "cycle")


def test_missing_initializer(run, tmp_path, has_nodes_script):
    from onnx import helper

    from tests.helpers.models import f32

    nodes = [helper.make_node("Mul", ["x", "weights"], ["y"], name="mul")]
    model = _save_unchecked(tmp_path / "noinit.onnx", nodes, [f32("x", [1])], [f32("y", [1])])
    one_line_error(
        run("mode=reduce", f"model={model}", check_cmd(has_nodes_script, "{artifact}", "mul")),
        "'weights'",
        "initializer",
    )


@pytest.mark.slow
def test_tensor_without_shape_names_the_tensor_and_the_option(run, tmp_path, has_nodes_script):
    from onnx import helper

    from tests.helpers.models import f32

    # a custom-domain op: shape inference cannot type its output and ONNX Runtime cannot run it
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mystery", ["r"], ["m"], name="mystery", domain="com.example"),
        helper.make_node("Neg", ["m"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(nodes, "custom", [f32("x", [1, 4])], [f32("y", [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    r = run("mode=reduce", f"model={path}", check_cmd(has_nodes_script, "{artifact}", "neg"))
    line = one_line_error(r, "'m'", "model_input_shapes=", "inputs=")
    assert "ONNX Runtime could not run the model" in line


def test_verbose_shows_the_traceback(run, ok_script, tmp_path):
    r = run("mode=reduce", f"model={tmp_path / 'nope.onnx'}", check_cmd(ok_script), "verbose=true")
    assert r.returncode == 2 and "Traceback" in r.stderr and "error: model=" in r.stderr


@pytest.mark.parametrize("kind", ["npy", "truncated"])
@pytest.mark.parametrize("option", ["inputs", "golden"])
@pytest.mark.slow
def test_inputs_that_are_not_npz(run, tmp_path, kind, option):
    import numpy as np

    model = tmp_path / "m.onnx"
    onnx.save(chain_model(3), model)
    if kind == "npy":
        path = tmp_path / "x.npy"
        np.save(path, np.ones((1, 4), np.float32))
        words = ["unnamed array (.npy)"]
    else:
        np.savez(tmp_path / "full.npz", x=np.ones((1, 4), np.float32))
        data = (tmp_path / "full.npz").read_bytes()
        path = tmp_path / "cut.npz"
        path.write_bytes(data[: len(data) // 2])
        words = ["not a readable .npz"]
    one_line_error(run("mode=reduce", f"model={model}", "checker=compare", f"{option}={path}"), f"{option}=", *words)


def test_missing_external_data_file(run, tmp_path, ok_script):
    import numpy as np
    from onnx import numpy_helper

    m = chain_model(3)
    m.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "w"))
    model = tmp_path / "ext.onnx"
    onnx.save(m, model, save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    (tmp_path / "ext.onnx.data").unlink()
    one_line_error(run("mode=reduce", f"model={model}", check_cmd(ok_script)), "external data", "keep the data file")


@pytest.mark.parametrize("override", ["mode=mode_schema", "marker=marker_schema", "checker=command_schema"])
@pytest.mark.slow
def test_schema_names_are_not_choices(run_cli, override, ok_script):
    r = run_cli(override, check_cmd(ok_script))
    group = override.split("=")[0]
    one_line_error(r, f"{override}: no such {group}", "use one of", code=2)


@pytest.mark.slow  # a fresh process: about 1 s
def test_ctrl_c_while_starting_is_quiet(tmp_path, ok_script, chain):
    """Ctrl-C while the heavy imports load (numpy is mapped, onnxruntime may not be yet): exit 130, no traceback.
    A run of a model loads them (a run of none no longer does: it would end before the signal came)."""
    import signal
    import subprocess
    import sys
    import time

    cmd = [
        sys.executable,
        "-m",
        "runner",
        "mode=reduce",
        f"model={chain}",
        check_cmd(ok_script, "{artifact}"),
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    loading = False
    while not loading and proc.poll() is None and time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/maps") as maps:
            loading = "numpy" in maps.read()  # inside the entry point's guarded imports
        time.sleep(0.002)
    assert loading, "the run ended (or never loaded numpy) before it could be interrupted while starting"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["mode=repeat", "until=1", "direction=reverse"], ["direction= is not used by mode=repeat", "mode=precision"]),
        (
            ["mode=diff_tactics", "dir=.", "min_good=x.onnx"],
            ["min_good= is not used by mode=diff_tactics", "mode=reduce"],
        ),
        (["mode=repeat", "until=1", "+fp16=true"], ["fp16= is not an option"]),
        (["mode=build", "until=1", "inputs=x.npz"], ["inputs= is not used by mode=build"]),
    ],
)
def test_a_key_the_mode_does_not_use_is_an_error(run, overrides, words):
    r = run(*overrides, 'checker.cmd="true"' if "mode=diff_tactics" not in overrides else "verbose=false")
    one_line_error(r, *words, code=2)
    assert r.summary["checks"] == 0


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["marker=bisect", "tie_blocks=false"], ["tie_blocks= is not used by marker=bisect", "marker=minimal"]),
        (["marker=bisect", "untie=none"], ["untie= is not used by marker=bisect", "marker=minimal"]),
        (["marker=linear", "exchange_checks=4"], ["exchange_checks= is not used by marker=linear"]),
        (
            ["low_precision=float16", "calibration.cache=cal.json"],
            ["calibration.cache= is not used by low_precision=float16", "low_precision=int8"],
        ),
        (["low_precision=bfloat16", "quantization.per_channel=false"], ["quantization.per_channel= is not used by"]),
    ],
)
def test_a_key_the_chosen_marker_or_precision_does_not_use_is_an_error(run, chain, overrides, words, tmp_path):
    """These were taken and ignored: the search ran as if they were not given."""
    r = run("mode=precision", f"model={chain}", "checker=compare", *overrides)
    one_line_error(r, *words, code=2)
    assert r.summary["checks"] == 0 and not (tmp_path / "cal.json").exists()


def test_layerwise_calibration_keys_need_an_int8_target(run, chain):
    r = run("mode=layerwise", f"model={chain}", "calibration.method=entropy")
    one_line_error(r, "calibration.method= is not used by checker.low_precision=null", "checker.low_precision=int8")


@pytest.mark.parametrize("iterations", [0, -1, 1, 3])
def test_iterations_with_a_data_loader_is_one_message_for_every_value(run, chain, tmp_path, iterations):
    """Was: 0 and -1 "give 1 or more", 3 "drop it", and 1 silently taken."""
    (tmp_path / "loader.py").write_text(
        "import numpy as np\ndef load():\n    yield {'x': np.zeros((1, 4), np.float32)}\n"
    )
    r = run(
        "mode=repeat", "until=1", f"model={chain}", "checker=compare",
        f"data_loader={tmp_path / 'loader.py'}:load", f"iterations={iterations}",
    )  # fmt: skip
    one_line_error(r, "iterations= sets how many inputs are generated", "drop iterations=", code=2)
    assert r.summary["checks"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, words",
    [
        ("nosuch_key=1", ["nosuch_key= is not an option", "--help"]),
        ("seed=abc", ["seed=abc", "could not be converted to Integer"]),
        ("direction=sideways", ["direction=sideways", "expected one of [forward, reverse, ranked]"]),
        ("untie=some", ["untie=some", "expected one of [auto, nodes, none]"]),
        ("marker=nosuch", ["marker=nosuch: no such marker", "use one of auto, bisect, linear, minimal"]),
        ("seed=[", ["cannot read the override in seed=[", "quote values"]),
    ],
)
def test_an_override_hydra_cannot_compose_is_one_line(run_cli, chain, override, words):
    """Hydra printed these as several lines and exited 1: now one line naming the override and the fix, exit 2."""
    r = run_cli("mode=precision", f"model={chain}", override)
    one_line_error(r, *words, code=2)
    assert "HYDRA_FULL_ERROR" not in r.stderr


def test_a_failure_that_is_not_hydras_is_left_alone():
    from runner.__main__ import composition_error

    assert composition_error(ValueError("x")) is None
