"""Reduce's gates: the user's file is checked first, a failure that needs Constant nodes keeps them, and a
check that never passes gives no culprit."""

from __future__ import annotations

import sys

import onnx
import pytest

from tests.helpers.checks import reduce_args
from tests.helpers.cli import NODE_NAMES, check_cmd, one_line_error, write_script
from tests.helpers.models import sha256


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


def test_the_culprit_first_in_order_is_still_found(run, tmp_path, chain, has_nodes_script):
    """No search candidate passes when the culprit is the first node: a control check shows the check can pass."""
    r = run(*reduce_args(chain, "n0"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["n0"]
    labels = [e["label"] for e in r.replay["iterations"]]
    assert any(label.startswith("control") for label in labels)


NEEDS_A_CONSTANT_NODE = (
    NODE_NAMES
    + """
has = node_names(sys.argv[1])
sys.exit(1 if "const" in has and "n3" in has else 0)
"""
)


@pytest.mark.slow
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


@pytest.mark.slow
def test_iteration_one_checks_a_byte_copy_of_the_users_file(run, tmp_path, chain):
    script = write_script(
        tmp_path / "same.py",
        f'''
import hashlib, os, sys
same = hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest() == "{sha256(chain)}"
open(sys.argv[2], "a").write(f"{{os.environ['RUNNER_ITERATION']}} {{same}}\\n")
sys.exit(1 if same or os.environ["RUNNER_ITERATION"] != "1" else 0)
''',
    )
    log = tmp_path / "seen.txt"
    run("mode=reduce", f"model={chain}", check_cmd(script, "{artifact}", str(log)))
    assert log.read_text().splitlines()[0] == "1 True"


@pytest.mark.slow
def test_an_answer_that_does_not_hold_as_written_ends_with_exit_3(run, chain, tmp_path):
    """A check that changes its mind on the written answer (it passes the file the iteration info calls
    the answer): the run writes the answer, says it cannot stand behind it, and exits 3."""
    info = tmp_path / "info.json"
    script = write_script(
        tmp_path / "fickle.py",
        "import json, sys, onnx\n"
        f"label = json.load(open({str(info)!r}))['candidate']['label']\n"
        "names = {n.name for n in onnx.load(sys.argv[1]).graph.node}\n"
        "sys.exit(0 if 'answer as written' in label or 'n3' not in names else 1)\n",
    )
    r = run("mode=reduce", f"model={chain}", check_cmd(script, "{artifact}"), f"artifacts.iter_info={info}")
    one_line_error(r, "answer not verified", "as written passes the check", code=3)
    s = r.summary
    assert s["status"] == "answer not verified" and s["answer_verified"]["passed"] is False
    assert s["answer_verified"]["check_passed"] is True
