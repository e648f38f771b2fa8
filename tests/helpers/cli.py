"""Running the tool as a user does: ``python -m runner`` in a subprocess, and check scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

#: a check script's first lines: ``node_names(path)``, the names of a model file's nodes, read with onnx's own
#: ``ModelProto`` (its generated protobuf module, loaded without the onnx package's 0.3 s of imports)
NODE_NAMES = """
import importlib.util, os, sys
_package = importlib.util.find_spec("onnx").submodule_search_locations[0]  # found, not imported
_pb2 = importlib.util.spec_from_file_location("onnx_ml_pb2", os.path.join(_package, "onnx_ml_pb2.py"))
onnx_ml_pb2 = importlib.util.module_from_spec(_pb2)
_pb2.loader.exec_module(onnx_ml_pb2)


def node_names(path):
    model = onnx_ml_pb2.ModelProto()
    with open(path, "rb") as f:
        model.ParseFromString(f.read())
    return {n.name for n in model.graph.node}
"""

#: fails (exit 1) while the model holds every node named: ``{artifact} NAMES...``
HAS_NODES = (
    NODE_NAMES
    + """
sys.exit(1 if all(x in node_names(sys.argv[1]) for x in sys.argv[2:]) else 0)
"""
)


class RunResult:
    """A finished run: exit code, output and the run directory's files (subprocess or in-process)."""

    def __init__(self, returncode: int, stdout: str, stderr: str, run_dir: Path):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.run_dir = run_dir

    @property
    def summary(self) -> Dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def replay(self) -> Dict[str, Any]:
        return json.loads((self.run_dir / "replay.json").read_text())


def run_process(
    tmp_path: Path,
    name: str,
    *args: str,
    cwd: Optional[Path] = None,
    timeout: float = 600,
    run_dir: Optional[Path] = None,
) -> RunResult:
    """Run ``python -m runner ARGS`` in a subprocess with its run directory in ``tmp_path/name``."""
    run_dir = run_dir or tmp_path / name
    cmd = [sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        cmd, cwd=cwd or tmp_path, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return RunResult(proc.returncode, proc.stdout, proc.stderr, run_dir)


#: fails (exit 1) while the model file holds every name given, after sleeping SECONDS: ``{artifact} SECONDS
#: NAMES...``; a byte search, so no onnx import per check: give names no other name or tensor contains
SLOW_HAS_NODES = """
import sys, time
time.sleep(float(sys.argv[2]))
data = open(sys.argv[1], "rb").read()
sys.exit(1 if all(x.encode() in data for x in sys.argv[3:]) else 0)
"""


def start_process(cwd: Path, *args: str, run_dir: Optional[Path] = None) -> subprocess.Popen:
    """Start ``python -m runner ARGS`` without waiting (text pipes for stdout and stderr)."""
    extra = [f"hydra.run.dir={run_dir}"] if run_dir else []
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args, *extra],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, limit: float = 60) -> None:
    """Wait until ``predicate()`` holds, looking every 50 ms; fail the test if the run ``proc``
    ends first (with its output) or ``limit`` seconds pass."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the run did not get there")


def replay_iterations(replay: Path) -> int:
    """How many iterations the replay file records so far (0 before it exists)."""
    return len(json.loads(replay.read_text())["iterations"]) if replay.exists() else 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def write_script(path: Path, body: str) -> Path:
    """Write a Python check script and return its path."""
    path.write_text(body)
    return path


def check_cmd(script: Path, *args: str) -> str:
    """The ``checker.cmd=...`` override for running ``script`` with this Python."""
    argv = " ".join([sys.executable, str(script), *args])
    return f'checker.cmd="{argv}"'


def one_line_error(r: RunResult, *words: str, code: Optional[int] = None) -> str:
    """Assert the run failed with exactly one ``error:`` line holding ``words`` and no traceback."""
    assert r.returncode != 0 if code is None else r.returncode == code, (r.returncode, r.stderr[-2000:])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]
