"""Adding a checker is its module, its schema and its YAML file: a toy checker added that way runs through
the CLI, ``--help`` lists its keys, its keys are checked like every checker's, and nothing else changed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.test_readme import ROOT

TOY_MODULE = '''
"""``checker=has_node``: fails while the candidate holds node ``node`` (a toy checker for the tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import onnx

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker
from runner.executors.slot import Slot


class HasNodeChecker(Checker):
    verdict_by_bytes = True

    def __init__(self, node: str):
        self.node = node

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        names = {n.name for n in onnx.load(str(artifact), load_external_data=False).graph.node}
        return Verdict(self.node not in names, reason=f"{self.node} {'in' if self.node in names else 'not in'} it")
'''

TOY_SCHEMA = '''

@dataclass
class HasNodeCheckerConf:
    """Fails while the candidate holds one node (a toy checker)."""

    _target_: str = "runner.checkers.has_node.HasNodeChecker"
    node: str = MISSING
'''

TOY_YAML = """defaults:
  - /has_node_schema@_here_
"""


@pytest.mark.slow
def test_a_checker_added_as_its_module_schema_and_yaml_runs_through_the_cli(tmp_path, chain):
    tree = tmp_path / "project"
    for package in ("runner", "strategies", "statemachine", "conf"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "runner" / "checkers" / "has_node.py").write_text(TOY_MODULE)
    with open(tree / "runner" / "config.py", "a") as schemas:
        schemas.write(TOY_SCHEMA)
    (tree / "conf" / "checker" / "has_node.yaml").write_text(TOY_YAML)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree), "HOME": str(tmp_path)}

    def cli(*args: str, name: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "runner", "mode=reduce", f"model={chain}", "checker=has_node", *args]
        argv.append(f"hydra.run.dir={tmp_path / name}")
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    listed = subprocess.run(
        [sys.executable, "-m", "runner", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert "  has_node      Fails while the candidate holds one node (a toy checker)." in listed.stdout
    assert "checker.node=(required)" in listed.stdout, listed.stdout[-3000:]
    ok = cli("checker.node=n3", f"output={tmp_path / 'reduced.onnx'}", name="ok")
    assert ok.returncode == 0, ok.stderr[-2000:]
    summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert [n["name"] for n in summary["reduced_nodes"]] == ["n3"]
    assert summary["answer_verified"]["passed"] and summary["answer_verified"]["same_bytes"]
    stray = cli("checker.node=n3", "checker.atol=1", name="stray")
    errors = [line for line in stray.stderr.splitlines() if line.startswith("error: ")]
    assert stray.returncode == 2 and errors == [
        "error: checker.atol= is not used by checker=has_node; it is an option of checker=compare"
    ]
