"""The import layers (ARCHITECTURE.md): runner's building blocks at the bottom, then strategies, then
statemachine, then the entry modules that assemble a run. An upward import (a lower module importing a
higher one, at the top of a file or inside a function) is what let the vocabulary drift up the layers
before; issue 21 allows at most 1, and there are none."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
#: the modules that assemble and start a run: they import every layer
ENTRY = ("runner.app", "runner.assembly", "runner.api", "runner.__main__")


def layer(module: str) -> Optional[int]:
    """0: runner's building blocks; 1: strategies; 2: statemachine; 3: the entry modules; None: not ours."""
    if module in ENTRY:
        return 3
    top = module.split(".")[0]
    return {"runner": 0, "conf": 0, "strategies": 1, "statemachine": 2}.get(top)


def upward_imports(root: Path = ROOT) -> List[Tuple[str, str, int]]:
    """(importer, imported, line) for every import of a higher layer, in the three packages under ``root``."""
    found = []
    for package in ("runner", "strategies", "statemachine"):
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    low, high = layer(module), layer(name)
                    if low is not None and high is not None and high > low:
                        found.append((module, name, node.lineno))
    return found


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    """A test of the walk: a building block that imports the lifecycle inside a function is one upward import;
    the entry module importing it is none."""
    (tmp_path / "runner" / "graph").mkdir(parents=True)
    (tmp_path / "runner" / "graph" / "load.py").write_text("def f():\n    from statemachine.lifecycle import L\n")
    (tmp_path / "runner" / "assembly.py").write_text("from statemachine.lifecycle import L\n")
    assert upward_imports(tmp_path) == [("runner.graph.load", "statemachine.lifecycle", 2)]
