"""Helpers shared by the benchmark scripts: run a command or a runner job, count check runs, count nodes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import onnx

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("RUNNER_SHARED_MODELS", ROOT.parent / "shared" / "models"))

#: a check that fails while the model holds every node named, and counts its own runs
COUNTING_CHECK = """
import os, sys, onnx
with open(os.environ["BENCH_COUNTER"], "a") as f:
    f.write("x")
names = {n.name for n in onnx.load(sys.argv[1], load_external_data=False).graph.node}
sys.exit(1 if all(x in names for x in sys.argv[2:]) else 0)
"""


def polygraphy_exe() -> str:
    """The ``polygraphy`` command on PATH; exits the benchmark with the install line when there is none."""
    found = shutil.which("polygraphy")
    if found is None:
        sys.exit('polygraphy is not installed: pip install ".[benchmark]"')
    return found


def timed(cmd: List[str], cwd: Path, env: Dict[str, str]) -> Tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd``; return (wall seconds, the finished process)."""
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True)
    return time.monotonic() - start, proc


def run_job(
    args: List[str], run_dir: Path, cwd: Path, what: str, env: Optional[Dict[str, str]] = None
) -> Tuple[float, Dict]:
    """Run ``python -m runner ARGS`` with its run directory at ``run_dir``; return (wall seconds, its
    ``summary.json``). Exits the benchmark, naming ``what`` and the run's stderr, if the run fails."""
    wall, proc = timed(runner_cmd(*args, f"hydra.run.dir={run_dir}"), cwd, env or {})
    if proc.returncode != 0:
        sys.exit(f"{what} failed:\n{proc.stderr[-2000:]}")
    return wall, json.loads((run_dir / "summary.json").read_text())


def compute_nodes(path: Path) -> Tuple[int, int]:
    """(non-Constant nodes, all nodes) of a saved model."""
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    return sum(n.op_type != "Constant" for n in nodes), len(nodes)


def runner_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "runner", *args]


def print_rows(title: str, rows: List[Dict]) -> None:
    """A plain table on stdout, and the rows as JSON after it."""
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print(f"\n{title}")
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
    print(json.dumps(rows))
