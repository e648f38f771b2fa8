"""The config groups' YAML files (Hydra's search path ``pkg://conf``), and the one list of checkers.

A checker is listed once: its group file ``conf/checker/<name>.yaml``. Everything that lists checkers
(the schemas stored in Hydra's ConfigStore, ``--help``, the API's ``check=`` names) reads them from
here, with its schema named by one rule (``checker_schema``). This module imports nothing: ``--help``
reads it without Hydra.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

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
