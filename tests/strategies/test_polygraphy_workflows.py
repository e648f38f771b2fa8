"""Polygraphy's documented workflows that run without TensorRT, typed as its users type them (issue 52): the
debug README's reduce against golden values of every tensor (``polygraphy run`` as the check, at its default
tolerance), and a data loader script in ``--data-loader-script`` form."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers.models import CLASSIFIER, need, perturbed_classifier

POLYGRAPHY = str(Path(sys.executable).parent / "polygraphy")


def polygraphy(*args: str, cwd: Path) -> None:
    done = subprocess.run([POLYGRAPHY, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture
def golden_of_every_tensor(tmp_path):
    """The debug README's steps: the good model's inputs and every tensor's value, merged into one file."""
    good = tmp_path / "good.onnx"
    good.write_bytes(need(CLASSIFIER).read_bytes())
    model, conv = perturbed_classifier(1.5)
    onnx.save(model, tmp_path / "bad.onnx")
    polygraphy(
        "run",
        "good.onnx",
        "--onnxrt",
        "--input-shapes",
        "x:[1,3,48,192]",
        "--save-inputs",
        "inputs.json",
        "--onnx-outputs",
        "mark",
        "all",
        "--save-outputs",
        "golden.json",
        cwd=tmp_path,
    )
    polygraphy("data", "merge", "inputs.json", "golden.json", "-o", "all_inputs.json", cwd=tmp_path)
    return conv


CHECK = 'checker.cmd="{} run {{artifact}} --onnxrt --load-inputs all_inputs.json --load-outputs golden.json"'


@pytest.mark.slow
@pytest.mark.parametrize("marker, every, most", [("bisect", False, 16), ("minimal", False, 25), ("bisect", True, 16)])
def test_reduce_against_polygraphys_own_check_finds_the_node(
    run, tmp_path, golden_of_every_tensor, marker, every, most
):
    """Polygraphy's check at its default 1e-5 failed our candidates on fp32 rounding (ONNX Runtime fused
    and re-laid out what the golden run, with every tensor an output, computed unfused): 32 nodes without
    the culprit in 225 checks. Each candidate now outputs every tensor of the golden file it computes; past
    its boundary under names Polygraphy's matching skips, so a check compares a few outputs (Polygraphy's
    comparison costs about 8 ms an output), unless ``compare_every_tensor=true``."""
    r = run(
        "mode=reduce",
        f"marker={marker}",
        f"model={tmp_path / 'bad.onnx'}",
        "model_input_shapes={x:[1,3,48,192]}",
        CHECK.format(POLYGRAPHY),
        f"output={tmp_path / 'reduced.onnx'}",
        f"compare_every_tensor={str(every).lower()}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == [golden_of_every_tensor]
    assert r.summary["checks"] <= most
    compared = [log.read_text().count("Comparing Output") for log in (tmp_path / "run1" / "checks").glob("iter*.log")]
    assert len(compared) == r.summary["checks"]
    if every:
        assert max(compared) > 100, "the whole model as extracted outputs every tensor, and each is compared"
    else:
        assert max(compared) <= 3, compared


LOADER = """
import numpy as np

def load_data():
    for seed in range(3):
        yield {"x": np.random.default_rng(seed).random((1, 3, 48, 192)).astype(np.float32)}

def one():
    yield {"x": np.ones((1, 3, 48, 192), np.float32)}
"""


@pytest.mark.parametrize("loader, samples", [("loader.py:load_data", 3), ("loader.py", 3), ("loader.py:one", 1)])
def test_a_data_loader_script_in_polygraphys_form(run, tmp_path, loader, samples):
    (tmp_path / "loader.py").write_text(LOADER)
    model = need(CLASSIFIER)
    r = run("mode=repeat", "until=1", f"model={model}", "checker=compare", f"data_loader={loader}", cwd=tmp_path)
    assert r.returncode == 0 and r.summary["good"] == 1, r.stdout[-2000:]
    said = "checked on 3 input samples" in (r.run_dir / "runner.log").read_text()
    assert said == (samples == 3)


def test_iterations_generates_that_many_samples(run, tmp_path):
    r = run(
        "mode=repeat",
        "until=1",
        f"model={need(CLASSIFIER)}",
        "checker=compare",
        "iterations=2",
        "model_input_shapes={x:[1,3,48,192]}",
    )
    assert r.returncode == 0 and "checked on 2 input samples" in (r.run_dir / "runner.log").read_text()
    (tmp_path / "loader.py").write_text(LOADER)
    from tests.helpers.cli import one_line_error

    refused = run(
        "mode=repeat",
        "until=1",
        f"model={need(CLASSIFIER)}",
        "checker=compare",
        "iterations=2",
        "data_loader=loader.py",
        cwd=tmp_path,
    )
    one_line_error(refused, "iterations=", "drop it", code=2)


def test_repeat_without_a_model_warns_a_command_naming_the_artifact(run, tmp_path):
    """No file is written there (the check may write one, as a build does): the run says so."""
    r = run("mode=repeat", "until=1", 'checker.cmd="test ! -e {artifact}"')
    assert r.returncode == 0 and r.summary["good"] == 1
    assert "writes no file there" in (r.run_dir / "runner.log").read_text()
    quiet = run("mode=repeat", "until=1", "checker.cmd=true")
    assert "writes no file there" not in (quiet.run_dir / "runner.log").read_text()


def test_layerwise_honours_exclude_outputs(run, tmp_path):
    from examples.planted import two_branches
    from tests.helpers.cli import one_line_error

    model, _, _ = two_branches()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "x.npz", x=np.full((1, 8), 1.0, np.float32))
    r = run("mode=layerwise", f"model={path}", "checker.exclude_outputs=[nosuch]")
    one_line_error(r, "no node of the model computes", code=2)
    one_line_error(run("mode=layerwise", f"model={path}", "checker.exclude_outputs=[y]"), "leaves none", code=2)


def test_mark_all_leaves_out_an_intermediate_tensor(run, tmp_path):
    """Polygraphy's ``run --mark all`` compares every tensor; excluding one there (``checker.exclude_outputs``) leaves
    that tensor out: its node gets no row, the other nodes keep theirs. Through the command line and the API."""
    from examples.planted import two_branches
    from runner import api

    model, _, _ = two_branches()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    every = run("mode=layerwise", f"model={path}", "layerwise.plot=false")
    fewer = run("mode=layerwise", f"model={path}", "layerwise.plot=false", "checker.exclude_outputs=[pa]")
    assert every.returncode == 0 and fewer.returncode == 0, fewer.stderr

    def rows(run_dir):
        with open(run_dir / "layerwise.csv") as f:
            return {row["node"] for row in csv.DictReader(f)}

    assert rows(every.run_dir) - rows(fewer.run_dir) == {"mul_a"}
    assert fewer.summary["nodes"] == every.summary["nodes"] - 1
    through_api = api.layerwise(
        path, checker={"exclude_outputs": ["pa"]}, layerwise={"plot": False}, run_dir=tmp_path / "api"
    )
    assert through_api.ok and rows(tmp_path / "api") == rows(fewer.run_dir)


@pytest.mark.slow  # processes of their own
def test_no_check_command_asks_as_polygraphy_does(tmp_path, chain):
    """With no checker.cmd, Polygraphy asks for each candidate; so does the run when a pipe or a terminal
    can answer (here: the model as given passes, so nothing to reduce). With stdin at /dev/null it stays
    a one-line error naming the key."""
    from tests.helpers.models import ROOT

    argv = [sys.executable, "-m", "runner", "mode=reduce", f"model={chain}"]
    asked = subprocess.run(
        [*argv, f"hydra.run.dir={tmp_path / 'a'}"], input="y\n", capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert "user said yes" in (tmp_path / "a" / "runner.log").read_text(), asked.stderr[-2000:]
    assert asked.returncode == 2 and "answer that the model as given fails" in asked.stderr
    refused = subprocess.run(
        [*argv, f"hydra.run.dir={tmp_path / 'b'}"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert refused.returncode == 2 and "checker.cmd is not set" in refused.stderr
