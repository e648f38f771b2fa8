"""The import layers (ARCHITECTURE.md): runner's building blocks at the bottom, then strategies, then
statemachine, then the entry modules that assemble a run. An upward import (a lower module importing a
higher one, at the top of a file or inside a function) is what let the vocabulary drift up the layers
before; issue 21 allows at most 1, and there are none."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
#: the modules that assemble and start a run: they import every layer
ENTRY = ("runner.run.app", "runner.run.assembly", "runner.api", "runner.__main__")


def layer(module: str) -> Optional[int]:
    """0: runner's building blocks; 1: strategies; 2: statemachine; 3: the entry modules; None: not ours."""
    if module in ENTRY:
        return 3
    top = module.split(".")[0]
    return {"runner": 0, "conf": 0, "strategies": 1, "statemachine": 2}.get(top)


def imported_modules(path: Path) -> Iterator[Tuple[str, int]]:
    """(module, line) for each module an absolute import in ``path`` names, at the top of the file or
    inside a function (``from a.b import c`` names ``a.b``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)


def upward_imports(root: Path = ROOT) -> List[Tuple[str, str, int]]:
    """(importer, imported, line) for every import of a higher layer, in the three packages under ``root``."""
    found = []
    for package in ("runner", "strategies", "statemachine"):
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for name, line in imported_modules(path):
                low, high = layer(module), layer(name)
                if low is not None and high is not None and high > low:
                    found.append((module, name, line))
    return found


def test_no_module_imports_a_higher_layer():
    assert upward_imports() == []


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    """A test of the walk: a building block that imports the lifecycle inside a function is one upward import;
    the entry module importing it is none."""
    (tmp_path / "runner" / "graph").mkdir(parents=True)
    (tmp_path / "runner" / "graph" / "load.py").write_text("def f():\n    from statemachine.lifecycle import L\n")
    (tmp_path / "runner" / "run").mkdir()
    (tmp_path / "runner" / "run" / "assembly.py").write_text("from statemachine.lifecycle import L\n")
    assert upward_imports(tmp_path) == [("runner.graph.load", "statemachine.lifecycle", 2)]


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    """``{module: the project modules it imports}`` (at the top of a file or inside a function), over every
    module of runner, strategies, statemachine and conf under ``root``; ``from a.b import c`` counts as an
    import of module ``a.b.c`` where that is a module, else of ``a.b``."""
    modules = {}
    for package in ("runner", "strategies", "statemachine", "conf"):
        for path in sorted((root / package).rglob("*.py")):
            modules[".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = path

    def resolve(name: str) -> Optional[str]:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph: Dict[str, Set[str]] = {}
    for module, path in modules.items():
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            graph[module].update(r for r in map(resolve, names) if r is not None and r != module)
    return graph


def import_circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The circles of ``graph``: its strongly connected components of more than one module (Tarjan's
    algorithm, iterative), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    circles: List[List[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_module_imports_itself_through_others():
    """0 circles at file level: two modules that import each other (even inside a function) are one job
    split in two, or a lower one reaching up."""
    assert import_circles(import_graph()) == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    """A test of the walk: ``a`` imports ``b`` at the top, ``b`` imports ``a`` inside a function, ``c`` only
    imports ``a``: one circle, of ``a`` and ``b``."""
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "a.py").write_text("from runner.b import f\n")
    (tmp_path / "runner" / "b.py").write_text("def f():\n    from runner.a import g\n")
    (tmp_path / "runner" / "c.py").write_text("import runner.a\n")
    assert import_circles(import_graph(tmp_path)) == [["runner.a", "runner.b"]]


def package_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """``graph`` with runner's sub-packages as one node each (``runner.graph.load`` -> ``runner.graph``; a module
    directly in ``runner/`` stays itself), the imports inside one sub-package dropped."""

    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "runner" and len(parts) > 2 else module

    packed: Dict[str, Set[str]] = {}
    for module, imported in graph.items():
        packed.setdefault(package(module), set()).update(package(i) for i in imported)
    return {module: imported - {module} for module, imported in packed.items()}


def test_no_package_of_runner_imports_itself_through_others():
    """runner/ is grouped by job (run/, files/, terminal/, graph/, checkers/, executors/, ...): 0 circles
    between its sub-packages either, so each can be read, tested and moved knowing only those below it."""
    assert import_circles(package_graph(import_graph())) == []


def test_a_circle_between_packages_is_found(tmp_path):
    """A test of the walk: ``runner.a.x`` imports ``runner.b.y``, ``runner.b.z`` imports ``runner.a.w``: no
    file-level circle, one between the packages."""
    for package, module, text in (("a", "x", "import runner.b.y\n"), ("b", "z", "import runner.a.w\n")):
        (tmp_path / "runner" / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / "runner" / package / f"{module}.py").write_text(text)
    (tmp_path / "runner" / "a" / "w.py").write_text("")
    (tmp_path / "runner" / "b" / "y.py").write_text("")
    graph = import_graph(tmp_path)
    assert import_circles(graph) == []
    assert import_circles(package_graph(graph)) == [["runner.a", "runner.b"]]


def imports_of_tests(root: Path = ROOT) -> List[Tuple[str, int]]:
    """(file, line) for every import of the ``tests`` package from ``benchmarks/`` or ``examples/``: a benchmark or
    an example stands on the product and on ``examples`` (the planted-fault models live there), never on the
    test suite's helpers, so a change to a test cannot change a figure."""
    found = []
    for folder in ("benchmarks", "examples"):
        for path in sorted((root / folder).rglob("*.py")):
            for name, line in imported_modules(path):
                if name == "tests" or name.startswith("tests."):
                    found.append((str(path.relative_to(root)), line))
    return found


def test_benchmarks_and_examples_do_not_import_the_tests(tmp_path):
    assert imports_of_tests() == []
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text("import os\n\ndef f():\n    from tests.helpers.graphs import x\n")
    assert imports_of_tests(tmp_path) == [("benchmarks/b.py", 4)]


def test_shared_rooms_name_nothing_of_switched_runs():
    """Precision's switched runs live in the low-precision package, the compare checker and the strategy:
    the lifecycle and the executors ask ``Checker.needs`` and read ``Checker.facts``, and ``candidates.py``,
    the vocabulary every layer shares, imports nothing of the project."""
    shared = [ROOT / "statemachine" / "lifecycle.py", *sorted((ROOT / "runner" / "executors").glob("*.py"))]
    naming = [path.name for path in shared if "switch" in path.read_text().lower()]
    assert naming == []
    ours = ("runner", "strategies", "statemachine", "conf")
    imports = [name for name, _ in imported_modules(ROOT / "runner" / "candidates.py") if name.split(".")[0] in ours]
    assert imports == []


def test_no_module_outside_the_checkers_reaches_into_the_compare_checker():
    """Layerwise, reduce and the rankings read ``Checker.comparison()``, a record, instead of testing for
    the compare checker's class and reading its attributes."""
    reaching = [
        str(path.relative_to(ROOT))
        for package in ("runner", "strategies", "statemachine")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "checkers" not in path.parts and "CompareChecker)" in path.read_text()
    ]
    assert reaching == []


def test_the_run_names_no_mode_and_no_precision():
    """``runner/run/`` assembles any mode: what a mode defaults for its checker comes from its keys
    (``checker_defaults``), not from tests of its name or its precision there."""
    import re

    named = re.compile(r"""[=!]=\s*["'](precision|reduce|layerwise|int8|float16|bfloat16|tensorrt)["']""")
    found = [
        f"{path.name}: {match.group(0)}"
        for path in sorted((ROOT / "runner" / "run").glob("*.py"))
        for match in named.finditer(path.read_text())
    ]
    assert found == []


#: the classes that make precision candidates: only ``runner/lowp`` tells them apart (``runner.lowp.makers``)
MAKER_CLASSES = frozenset(
    {
        "Converter",
        "Quantizer",
        "PlacedQuantizer",
        "Fp8Quantizer",
        "GivenQuantizer",
        "MixedQuantizer",
        "CandidateMaker",
        "CastMaker",
        "QdqMaker",
        "PlacedMaker",
        "OnnxRuntimeMaker",
        "MixedMaker",
        "FloatRest",
        "SingleStage",
    }
)


def asks_which_maker(root: Path = ROOT) -> List[Tuple[str, int]]:
    """(file, line) of each ``isinstance(x, C)`` with ``C`` a candidate maker or stage class outside ``runner/lowp``
    and the tests: a search asks its maker and its stage, never which one it holds."""
    found = []
    for package in ("runner", "strategies", "statemachine"):
        for path in sorted((root / package).rglob("*.py")):
            if path.parent.name == "lowp":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"):
                    continue
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(getattr(kind, "id", getattr(kind, "attr", None)) in MAKER_CLASSES for kind in kinds):
                    found.append((str(path.relative_to(root)), node.lineno))
    return found


def test_no_search_asks_which_maker_it_holds(tmp_path):
    """A precision is a record plus a maker (ARCHITECTURE.md, "Adding a precision"): the strategy asks its
    ``Stage`` and its ``CandidateMaker``; no module outside ``runner/lowp`` tests for a maker's class."""
    assert asks_which_maker() == []
    (tmp_path / "strategies").mkdir()
    (tmp_path / "strategies" / "s.py").write_text("def f(b):\n    return isinstance(b, (int, PlacedQuantizer))\n")
    assert asks_which_maker(tmp_path) == [("strategies/s.py", 2)]


def test_every_precision_names_a_maker():
    """Each low-precision record names a maker ``make_maker`` has (a record without one fails here, not in a run)."""
    from runner.lowp.makers import MAKERS
    from runner.lowp.precisions import LOW_PRECISIONS, QUANTIZED

    assert {low.name: low.maker in MAKERS for low in [*LOW_PRECISIONS.values(), *QUANTIZED.values()]} == {
        "float16": True,
        "bfloat16": True,
        "int8": True,
        "float8": True,
    }
