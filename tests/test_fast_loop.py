"""The inner loop's guard: an unmarked test over ``FAST_LIMIT_S`` fails (``tests/conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_an_unmarked_test_over_the_limit_fails_and_a_marked_one_passes(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_timed.py").write_text(
        "import time\nimport pytest\n\n"
        "def test_unmarked():\n    time.sleep(1.0)\n\n"
        "@pytest.mark.slow\ndef test_marked():\n    time.sleep(1.0)\n\n"
        "def test_quick():\n    pass\n"
    )
    # the limit is 10x under the sleep: the verdict holds up to a load of 10 per core (the hook scales by it)
    env = {**os.environ, "RUNNER_FAST_TEST_LIMIT_S": "0.1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-W", "ignore", "-rf"]
    r = subprocess.run([*cmd, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "1 failed, 2 passed" in r.stdout, r.stdout + r.stderr
    assert "test_unmarked took" in r.stdout and "mark it @pytest.mark.slow" in r.stdout
