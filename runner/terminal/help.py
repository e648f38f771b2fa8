"""``python -m runner --help``: every key of every group, generated from the schemas, in a fraction of a second.

Hydra's own help composes the whole config and copies it once per config group (about a second),
and importing the schemas imports Hydra. This help reads the keys where they are declared, from the
source: the dataclasses of ``runner/config.py`` (checkers and executors, as ``conf.checker_groups`` and
``conf.executor_groups`` list them; common keys) and each mode's keys dataclass, the one
its YAML names (``keys:``, in ``strategies/mode_keys.py``) or its module's ``KEYS`` (with the bases
it takes from ``runner/config.py``),
and the modes' ``help`` lines from ``conf/mode/*.yaml``. A key added to a schema appears here with
no other change. ``python -m runner KEY=VALUE ... --help`` still prints Hydra's help with the
composed config.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional

from conf import CONF, groups, mode_files, schema_name

ROOT = CONF.parent

EXIT_CODES = "0 answer, 2 error or check never passed, 3 answer not verified as written, 128+N interrupted by signal N"
#: fields that are the group's plumbing, not keys a user sets
PLUMBING = {"_target_", "name"}


class _Module:
    """The dataclasses of one source file: ``{class: ClassDef}``, read without importing it."""

    def __init__(self, path: Path):
        self.tree = ast.parse(path.read_text())
        self.classes: Dict[str, ast.ClassDef] = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}

    def assigned(self, name: str) -> Optional[str]:
        """The name a module-level ``NAME = Other`` binds, e.g. ``KEYS``."""
        for n in self.tree.body:
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                return ast.unparse(n.value)
        return None


def _value(node: Optional[ast.expr], modules: List[_Module], prefix: str) -> List[str]:
    """``key=default`` words for one field's default (a nested schema becomes its own ``key.sub=`` words)."""
    if node is None:
        return [f"{prefix}=(required)"]
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("candidate", "field"):
        kwargs = {k.arg: k.value for k in node.keywords}
        if "default_factory" in kwargs:
            factory = ast.unparse(kwargs["default_factory"])
            if factory in ("list", "dict"):
                return [f"{prefix}={'[]' if factory == 'list' else '{}'}"]
            if any(factory in m.classes for m in modules):
                return _fields(factory, modules, prefix + ".")
            return [f"{prefix}=..."]
        node = node.args[0] if node.args else kwargs.get("default")
        return _value(node, modules, prefix)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [f"{prefix}={node.value or chr(39) * 2}"]
    text = ast.unparse(node).replace("RUN_DIR + '", "<run dir>").rstrip("'")
    if isinstance(node, ast.Attribute):  # Direction.forward, OnError["stop"]
        text = node.attr
    elif isinstance(node, ast.Subscript):
        text = ast.unparse(node.slice).strip("'\"")
    text = {"None": "null", "True": "true", "False": "false", "MISSING": "(required)", "''": "''"}.get(text, text)
    return [f"{prefix}={text}"]


def _fields(name: str, modules: List[_Module], prefix: str = "", skip: FrozenSet[str] = frozenset()) -> List[str]:
    """Every key of dataclass ``name`` (its bases' first), found in ``modules``."""
    cls = next((m.classes[name] for m in modules if name in m.classes), None)
    if cls is None:
        return []
    out: List[str] = []
    for base in cls.bases:
        out.extend(_fields(ast.unparse(base), modules, prefix, skip))
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            key = stmt.target.id
            if key in PLUMBING or key in skip or ast.unparse(stmt.annotation).startswith("ClassVar"):
                continue  # a ClassVar is the class's own fact (used_with, not_with), no key
            out.extend(_value(stmt.value, modules, prefix + key))
    return out


def _yaml(path: Path) -> Dict[str, str]:
    """The top-level ``key: value`` lines of a group YAML, with ``help: |-`` blocks folded into one line."""
    out: Dict[str, str] = {}
    key = ""
    for line in path.read_text().splitlines():
        if line.startswith(" ") and key:
            out[key] = (out[key] + " " + line.strip()).strip()
        elif ":" in line and not line.startswith(("-", "#")):
            key, _, value = line.partition(":")
            value = value.split(" #")[0].strip()
            out[key] = "" if value in ("|-", "|", ">") else value
    return out


def _wrap(text: str, indent: int = 16) -> str:
    return textwrap.fill(text, 110, initial_indent=" " * indent, subsequent_indent=" " * indent)


def _options(group: str, config: _Module, skip: FrozenSet[str] = frozenset()) -> List[str]:
    """The help lines of each option of ``group`` (``conf/<group>/*.yaml``): its schema's first doc line, then
    its keys as ``<group>.KEY=DEFAULT`` (``skip``: fields that are not keys)."""
    lines = []
    for name in groups(group):
        schema = schema_name(group, name)
        doc = ast.get_docstring(config.classes[schema]) or ""
        lines.append(f"  {name:<13} " + _wrap(doc.splitlines()[0] if doc else "", 16).lstrip())
        keys = _fields(schema, [config], f"{group}.", skip=skip)
        if keys:
            lines.append(_wrap(", ".join(keys)))
    return lines


def _source(dotted: str) -> Path:
    """The source file of the module a dotted name starts with (``strategies.reduce.ReduceStrategy.create`` ->
    ``strategies/reduce.py``): this project's from its tree, another package's (a mode added through
    ``conf.MODE_ENTRY_POINTS``) from where Python finds it (its parent packages imported, not the module)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:end]).with_suffix(".py")
        if path.is_file():
            return path
    import importlib.util

    for end in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:end]))
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            return Path(spec.origin)
    raise FileNotFoundError(f"no source file for {dotted}")


def render() -> str:
    """The whole help text."""
    config = _Module(ROOT / "runner" / "config.py")
    lines = [
        "runner: find the smallest failing ONNX subgraph, the fewest nodes to keep in fp32, the layer where the",
        "numbers go wrong, or the flaky TensorRT tactic. Usage: python -m runner key=value ...  (Hydra overrides)",
        "",
        "Modes (mode=...), each with the keys it takes:",
    ]
    specs = [_yaml(p) for p in mode_files()]
    for spec in sorted(specs, key=lambda s: (int(s.get("help_order", 100)), s.get("name", ""))):
        name, target = spec.get("name", ""), spec.get("_target_", "")
        lines.append(f"  {name:<13} " + _wrap(spec.get("help", ""), 16).lstrip())
        if spec.get("keys"):  # the class the YAML names (strategies.mode_keys.<Class>)
            where, _, cls = str(spec["keys"]).rpartition(".")
            module = _Module(_source(where))
        else:  # the mode module's KEYS
            module = _Module(_source(target))
            cls = module.assigned("KEYS") or ""
        keys = _fields(cls, [module, config], skip=frozenset({"checker", "executor"}))
        lines.append(_wrap("keys: " + ", ".join(keys)))
    lines += ["", "Markers (marker=...): " + ", ".join(sorted(p.stem for p in CONF.glob("marker/*.yaml"))), ""]
    lines.append("Checkers (checker=...):")
    lines += _options("checker", config)
    lines += ["", "Executors (executor=...):"]
    lines += _options("executor", config, skip=frozenset({"name"}))
    lines += ["", "Common keys:", _wrap(", ".join(_fields("CommonKeys", [config], skip=frozenset({"mode"}))), 2)]
    lines += [
        "",
        f"Exit codes: {EXIT_CODES}",
        "",
        "Example:",
        "  python -m runner mode=reduce model=model.onnx 'checker.cmd=\"python check.py {artifact}\"'",
        "",
        "python -m runner KEY=VALUE ... --help prints Hydra's help with the composed config; --hydra-help Hydra's own.",
    ]
    return "\n".join(lines)
