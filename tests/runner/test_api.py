"""``runner.api``: each mode as a function, with the command line's answers."""

from __future__ import annotations

import onnx
import pytest

from runner import api
from tests.helpers.checks import python_check
from tests.helpers.models import CLASSIFIER, need
from tests.test_readme import _quick_start


@pytest.mark.slow
def test_reduce_gives_the_cli_answer_on_the_bundled_classifier(tmp_path):
    """The README's quick start through ``api.reduce``: the answer and the checks the README gives for the CLI
    (11 checks; the answer as written holds its last candidate's bytes, so takes its verdict;
    ``tests/test_readme.py`` runs the CLI command itself)."""
    argv = _quick_start()[3:]  # after "python -m runner"
    cmd = next(a for a in argv if a.startswith("checker.cmd="))[len("checker.cmd=") :].strip('"')
    model = next(a for a in argv if a.startswith("model="))[len("model=") :]
    from tests.test_readme import ROOT

    result = api.reduce(
        ROOT / model,
        cmd.replace("examples/", f"{ROOT / 'examples'}/"),
        model_input_shapes={"x": [1, 3, 48, 192]},
        output=tmp_path / "api.onnx",
        run_dir=tmp_path / "api_run",
    )
    assert result.ok, result.summary.get("status")
    assert result.summary["reduced_nodes"] == [{"name": "HardSigmoid@2", "op": "HardSigmoid"}]
    assert result.summary["checks"] == 11 and result.summary["answer_verified"]["check_passed"] is False
    assert result.summary["answer_verified"]["same_bytes"]
    assert result.run_dir == tmp_path / "api_run" and (result.run_dir / "replay.json").is_file()


def test_a_python_callable_is_the_check_and_group_options_are_dicts(tmp_path, chain):
    """Also inside a program that initialized Hydra itself (as the test helper does): its state comes back."""
    from hydra.core.global_hydra import GlobalHydra

    from tests.helpers.inprocess import ensure_hydra

    ensure_hydra()
    seen = []

    def fails_with_n3(path: str) -> bool:
        seen.append(path)
        return "n3" not in {n.name for n in onnx.load(path).graph.node}

    out, artifacts = tmp_path / "reduced.onnx", {"keep_intermediate": True, "dir": str(tmp_path / "art")}
    result = api.reduce(chain, fails_with_n3, marker="linear", artifacts=artifacts, output=out, run_dir=tmp_path / "r")
    assert result.ok and [n["name"] for n in result.summary["reduced_nodes"]] == ["n3"]
    assert len(seen) == result.summary["checks"]
    assert len(list((tmp_path / "art" / "intermediate").glob("*.onnx"))) == result.summary["checks"], (
        "a group as a dict"
    )
    assert GlobalHydra.instance().is_initialized()


def test_errors_come_back_as_on_the_command_line(tmp_path, chain):
    result = api.reduce(
        chain, None, seed=-1, overrides=python_check("n3"), output=tmp_path / "x.onnx", run_dir=tmp_path / "r"
    )
    assert result.exit_code == 2 and not result.ok and result.status.startswith("error: seed=-1")


@pytest.mark.slow
def test_precision_and_layerwise_on_the_classifier(tmp_path):
    model = need(CLASSIFIER)
    shapes = {"x": [1, 3, 48, 192]}
    emulated = {"backend": "fp16_emulation"}
    out = tmp_path / "mixed.onnx"
    p = api.precision(model, "compare", model_input_shapes=shapes, checker=emulated, output=out, run_dir=tmp_path / "p")
    assert p.ok and p.summary["answer_verified"]["passed"]
    lw = api.layerwise(model, model_input_shapes=shapes, layerwise={"plot": False}, run_dir=tmp_path / "l")
    assert lw.ok and lw.summary["nodes"] > 200


def test_the_api_keeps_a_users_file_refuses_a_loader_that_exits_and_keys_left_unused(tmp_path, chain):
    """Nothing lost through the API either: a user's file named as an output gets the ``_1`` name, a loader's
    ``sys.exit`` is the one-line status, and a key the marker does not use is refused."""
    mine = tmp_path / "mine.onnx"
    mine.write_bytes(b"my own notes")
    result = api.reduce(chain, None, overrides=python_check("n3"), output=mine, run_dir=tmp_path / "r1")
    assert result.ok and mine.read_bytes() == b"my own notes"
    assert result.summary["output"] == str(tmp_path / "mine_1.onnx")

    loader = tmp_path / "exits.py"
    loader.write_text("import sys\nsys.exit(4)\n")
    result = api.repeat(chain, "compare", until="1", data_loader=f"{loader}:load", run_dir=tmp_path / "r2")
    assert result.exit_code == 2 and "on import called sys.exit(4)" in result.status

    result = api.precision(chain, "compare", marker="bisect", tie_blocks=False, run_dir=tmp_path / "r3")
    assert result.exit_code == 2 and "tie_blocks= is not used by marker=bisect" in result.status
