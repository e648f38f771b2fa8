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


def checker_groups() -> List[str]:
    """The checker names ``checker=`` takes, sorted: the stems of ``conf/checker/*.yaml``.

    Returns:
        e.g. ``["command", "compare", "interactive", "python"]``.
    """
    return sorted(p.stem for p in (CONF / "checker").glob("*.yaml"))


def checker_schema(name: str) -> str:
    """The name of checker ``name``'s schema dataclass in ``runner/config.py`` (``compare`` ->
    ``CompareCheckerConf``), stored in Hydra's ConfigStore as ``<name>_schema``, which its group
    file extends (``defaults: [/<name>_schema@_here_]``).

    Args:
        name: a checker group's name (``checker_groups``).

    Returns:
        The class name.
    """
    return "".join(part.capitalize() for part in name.split("_")) + "CheckerConf"


def executor_groups() -> List[str]:
    """The executor names ``executor=`` takes, sorted: the stems of ``conf/executor/*.yaml``.

    Returns:
        e.g. ``["dask", "local", "processes", "serial"]``.
    """
    return sorted(p.stem for p in (CONF / "executor").glob("*.yaml"))


def executor_schema(name: str) -> str:
    """The name of executor ``name``'s schema dataclass in ``runner/config.py`` (``processes`` ->
    ``ProcessesExecutorConf``), stored in Hydra's ConfigStore as ``<name>_executor_schema``, which its
    group file extends (``defaults: [/<name>_executor_schema@_here_]``); it names the class
    (``_target_``) and holds the keys that class takes.

    Args:
        name: an executor group's name (``executor_groups``).

    Returns:
        The class name.
    """
    return "".join(part.capitalize() for part in name.split("_")) + "ExecutorConf"
