"""Start-up (issue 55): a run of no model imports neither NumPy, ONNX nor ONNX Runtime, and no mode's
module but its own; every mode's keys come from ``strategies.mode_keys`` (benchmarks/startup.py times it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.config_keys import group_targets, mode_keys, target_module

ROOT = Path(__file__).resolve().parents[3]

#: runs a command line in a fresh process, then prints the heavy modules it imported
IMPORTED = ROOT / "scripts" / "imported_modules.py"


@pytest.mark.slow  # a fresh process: about 1 s
def test_a_run_of_no_model_imports_no_onnx_numpy_or_other_modes(tmp_path: Path) -> None:
    run = ["mode=repeat", "until=1", "checker.cmd=true", f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run([sys.executable, str(IMPORTED), *run], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    line = [x for x in done.stdout.splitlines() if x.startswith("imported:")][-1]
    assert line.removeprefix("imported:").split() == []


def test_every_bundled_mode_names_its_keys_in_the_light_module() -> None:
    named = group_targets("mode", "keys")
    assert set(named) == set(group_targets("mode")), "a bundled mode without keys: its module loads at start-up"
    assert all(path.startswith("strategies.mode_keys.") for path in named.values())
    for mode, keys in mode_keys().items():  # the strategy's own KEYS is the same class
        assert target_module(group_targets("mode")[mode]).KEYS is keys, mode
