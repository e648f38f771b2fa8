"""Adding a mode is its own module and one YAML file: a toy mode added that way runs through the CLI,
its keys are checked like every mode's, and nothing else needed changing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.test_readme import ROOT

TOY_MODULE = '''
"""``mode=count_ops``: a report that counts the nodes of one op type (a toy mode for the tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from runner.context import RunContext
from strategies.base import Report


@dataclass
class CountOpsKeys:
    """``mode=count_ops``."""

    model: Optional[str] = None
    op: str = "Relu"


KEYS = CountOpsKeys


class CountOps(Report):
    def __init__(self, count: int, op: str):
        self.count, self.op = count, op

    @classmethod
    def create(cls, ctx: RunContext, keys: CountOpsKeys, *, checker: Any = None, marker: Any = None) -> "CountOps":
        return cls(sum(n.op_type == keys.op for n in ctx.model.graph.node), keys.op)

    def finish(self) -> None:
        pass

    def result(self) -> Dict[str, Any]:
        return {"op": self.op, "count": self.count}
'''

TOY_YAML = """defaults:
  - /mode_schema@_here_

name: count_ops
_target_: strategies.count_ops.CountOps.create
help: count the nodes of one op type (op=Relu)
"""


@pytest.mark.slow
def test_a_mode_added_as_one_module_and_one_yaml_runs_through_the_cli(tmp_path, chain):
    tree = tmp_path / "project"
    for package in ("runner", "strategies", "statemachine", "conf"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "strategies" / "count_ops.py").write_text(TOY_MODULE)
    (tree / "conf" / "mode" / "count_ops.yaml").write_text(TOY_YAML)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree), "HOME": str(tmp_path)}

    def cli(*args: str, name: str) -> subprocess.CompletedProcess:
        argv = [
            sys.executable,
            "-m",
            "runner",
            "mode=count_ops",
            f"model={chain}",
            *args,
            f"hydra.run.dir={tmp_path / name}",
        ]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    listed = subprocess.run(
        [sys.executable, "-m", "runner", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert "  count_ops     count the nodes of one op type (op=Relu)" in listed.stdout, listed.stdout[:2000]
    assert listed.stdout.index("  reduce ") < listed.stdout.index("  count_ops ")  # help_order: after the others
    ok = cli("op=Add", name="ok")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["count"] == 4
    stray = cli("direction=forward", name="stray")
    errors = [line for line in stray.stderr.splitlines() if line.startswith("error: ")]
    assert stray.returncode == 2 and errors == [
        "error: direction= is not used by mode=count_ops; it is an option of mode=precision"
    ]


@pytest.mark.slow
def test_a_mode_from_another_package_through_its_entry_point(tmp_path, chain):
    """Another package adds a mode without touching this project: its module and YAML beside an entry point
    (``conf.MODE_ENTRY_POINTS``), found through the installed package's metadata (a dist-info on the path)."""
    package = tmp_path / "site" / "toy_modes"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "count_ops.py").write_text(TOY_MODULE)
    (package / "count_ops.yaml").write_text(TOY_YAML.replace("strategies.count_ops", "toy_modes.count_ops"))
    info = tmp_path / "site" / "toy_modes-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-modes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[onnx_debug_runner.modes]\ntoy = toy_modes\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}", "HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "runner", *args]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    listed = cli("--help")
    assert "  count_ops     count the nodes of one op type (op=Relu)" in listed.stdout, listed.stdout[:2000]
    assert "keys: model=null, op=Relu" in listed.stdout
    ok = cli("mode=count_ops", f"model={chain}", "op=Add", f"hydra.run.dir={tmp_path / 'ok'}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["count"] == 4
    stray = cli("mode=count_ops", f"model={chain}", "direction=forward", f"hydra.run.dir={tmp_path / 'stray'}")
    assert stray.returncode == 2 and "direction= is not used by mode=count_ops" in stray.stderr
