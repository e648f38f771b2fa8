"""Shared fixtures: ``run`` (a job in-process), ``run_cli`` (``python -m runner`` in a subprocess), check scripts.

Builders live in ``tests/helpers/``; mode tests use ``run``, and ``run_cli`` is kept for what only a
process shows (exit codes, signals, stdout, the README's commands).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tests.helpers.cli import HAS_NODES, RunResult, run_process, write_script
from tests.helpers.inprocess import run_in_process
from tests.helpers.models import chain_model


def _runner(tmp_path: Path, how):
    counter = {"n": 0}

    def _run(*args: str, **kw) -> RunResult:
        counter["n"] += 1
        return how(tmp_path, f"run{counter['n']}", *args, **kw)

    return _run


def pytest_collection_modifyitems(items: list) -> None:
    """Start the tests marked ``slow`` first, so that no worker is left alone with one at the end."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)


@pytest.fixture
def run(tmp_path):
    """Run a job in this process (compose + ``runner.app.run``), its run dir in tmp, cwd tmp."""
    return _runner(tmp_path, run_in_process)


@pytest.fixture
def run_cli(tmp_path):
    """Run ``python -m runner ARGS`` in a subprocess, as a user would, with its run dir in tmp."""
    return _runner(tmp_path, run_process)


@pytest.fixture
def chain(tmp_path) -> Path:
    """An 8-node chain model (n0..n7 and a Constant) saved as ``tmp_path/model.onnx``."""
    path = tmp_path / "model.onnx"
    onnx.save(chain_model(8), path)
    return path


@pytest.fixture
def has_nodes_script(tmp_path) -> Path:
    """A check that fails (exit 1) when the model holds every node named on its command line."""
    return write_script(tmp_path / "has_nodes.py", HAS_NODES)
