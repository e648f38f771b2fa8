"""The README's first command (the main job on the bundled example) works as written."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _quick_start() -> list[str]:
    found = re.search(r"## Quick start\s+```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert found, "the README has a Quick start bash block"
    block = found.group(1)
    first, second = [line for line in block.splitlines() if line.strip()][:2]
    setup = 'python -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && python -m runner '
    assert first.startswith(setup)
    assert second.strip() == "python -m pytest"
    return shlex.split(first.rsplit("&&", 1)[1])


@pytest.mark.slow
def test_readme_main_command(tmp_path):
    argv = _quick_start()
    assert argv[:3] == ["python", "-m", "runner"]
    out = tmp_path / "reduced.onnx"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(
        [sys.executable, *argv[1:], f"output={out}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reduced_nodes"] == [{"name": "HardSigmoid@2", "op": "HardSigmoid"}]
    assert summary["checks"] <= 12 and out.is_file()
    assert "nodes_after" in proc.stdout, "the summary table is printed"
