"""The config groups' YAML files (Hydra's search path ``pkg://conf``), and the one list of checkers.

A checker is listed once: its group file ``conf/checker/<name>.yaml``. Everything that lists checkers
(the schemas stored in Hydra's ConfigStore, ``--help``, the API's ``check=`` names) reads them from
here, with its schema named by one rule (``checker_schema``). Modes may also come from other packages, through
the ``MODE_ENTRY_POINTS`` entry-point group (``mode_files``). This module imports only the standard library: ``--help``
reads it without Hydra.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import List, Tuple

#: this folder: the config groups (``checker/``, ``mode/``, ``marker/``, ``executor/``, ``artifacts/``)
CONF = Path(__file__).resolve().parent


def groups(group: str) -> List[str]:
    """The option names a config group takes, sorted: the stems of ``conf/<group>/*.yaml``.

    Args:
        group: ``checker`` or ``executor`` (any group folder).

    Returns:
        e.g. ``["command", "compare", "interactive", "python"]`` for ``checker``.
    """
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def schema_name(group: str, name: str) -> str:
    """The name of option ``name``'s schema dataclass in ``runner/config.py``: its words capitalized, then
    the group's (``compare`` -> ``CompareCheckerConf``, ``processes`` -> ``ProcessesExecutorConf``). It names
    the class (``_target_``) and holds the keys that class takes; its group file extends it
    (``defaults: [/compare_schema@_here_]``, ``[/processes_executor_schema@_here_]``).

    Args:
        group: ``checker`` or ``executor``. name: one of ``groups(group)``.

    Returns:
        The class name.
    """
    return "".join(part.capitalize() for part in [*name.split("_"), group]) + "Conf"


#: the entry-point group through which another package adds modes: each entry names a package whose folder holds
#: mode YAML files, as ``conf/mode/`` does (``[project.entry-points."onnx_debug_runner.modes"] mine = "my_pkg.modes"``)
MODE_ENTRY_POINTS = "onnx_debug_runner.modes"


def mode_files() -> List[Path]:
    """The mode YAML files: ``conf/mode/*.yaml``, then those of every installed package's ``MODE_ENTRY_POINTS`` entry.

    Returns:
        The paths, this project's first (each sorted by name).
    """
    return sorted((CONF / "mode").glob("*.yaml")) + list(plugin_mode_files())


@functools.cache
def plugin_mode_files() -> Tuple[Path, ...]:
    """The mode YAML files other packages add (``MODE_ENTRY_POINTS``): the ``*.yaml`` beside each entry's package.
    An entry whose package cannot be found is warned of and left out (``python -m runner --help`` lists the modes
    found).

    Returns:
        The paths, sorted by name within each package (read once a process).
    """
    import importlib.metadata
    import importlib.util
    import logging

    found: List[Path] = []  # read once a process: start-up asks twice (the keys, the ConfigStore)
    for entry in importlib.metadata.entry_points(group=MODE_ENTRY_POINTS):
        try:
            spec = importlib.util.find_spec(entry.value)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            logging.getLogger(__name__).warning(
                "the %s entry point %s = %s names no package; its modes are left out",
                MODE_ENTRY_POINTS,
                entry.name,
                entry.value,
            )
            continue
        for folder in spec.submodule_search_locations:
            found += sorted(Path(folder).glob("*.yaml"))
    return tuple(found)


def checker_groups() -> List[str]:
    """The checker names ``checker=`` takes (``groups("checker")``)."""
    return groups("checker")


def checker_schema(name: str) -> str:
    """Checker ``name``'s schema class name (``schema_name("checker", name)``), stored in Hydra's
    ConfigStore as ``<name>_schema``."""
    return schema_name("checker", name)


def executor_groups() -> List[str]:
    """The executor names ``executor=`` takes (``groups("executor")``)."""
    return groups("executor")


def executor_schema(name: str) -> str:
    """Executor ``name``'s schema class name (``schema_name("executor", name)``), stored in Hydra's
    ConfigStore as ``<name>_executor_schema``."""
    return schema_name("executor", name)
