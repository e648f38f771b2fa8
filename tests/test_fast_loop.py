"""The inner loop's guard: an unmarked test over ``FAST_LIMIT_S`` fails (``tests/conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a test directory's conftest that takes the guard's hooks
HOOKS = "from tests.conftest import pytest_runtest_call, pytest_runtest_makereport  # noqa: F401\n"
#: the guard's limit is ``RUNNER_FAST_TEST_LIMIT_S``
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-W", "ignore", "-rf"]


@pytest.mark.slow
def test_an_unmarked_test_over_the_limit_fails_and_a_marked_one_passes(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_call, pytest_runtest_makereport  # noqa: F401\n"
    )
    (tmp_path / "test_timed.py").write_text(
        "import time\nimport pytest\n\n"
        "def test_unmarked():\n    time.sleep(1.0)\n\n"
        "@pytest.mark.slow\ndef test_marked():\n    time.sleep(1.0)\n\n"
        "def test_quick():\n    pass\n"
    )
    # sleeping is no wait for a CPU: the limit stays 0.1 s however busy the machine is
    env = {**os.environ, "RUNNER_FAST_TEST_LIMIT_S": "0.1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([*PYTEST, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "1 failed, 2 passed" in r.stdout, r.stdout + r.stderr
    assert "test_unmarked took" in r.stdout and "mark it @pytest.mark.slow" in r.stdout


#: an unmarked test that computes for 0.2 s of CPU on one CPU shared with four spinning processes (started by its
#: fixture, whose time is not the test's): about 1 s
CROWDED = """
import os, subprocess, sys, time
import pytest

SPIN = "import os, time; os.sched_setaffinity(0, {%d}); end = time.time() + 30\\nwhile time.time() < end: pass"

@pytest.fixture
def crowd():
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN % cpu]) for _ in range(4)]
    time.sleep(0.5)  # the hogs are spinning
    yield
    for hog in hogs:
        hog.kill()

def test_crowded(crowd):
    began, cpu_began = time.monotonic(), time.process_time()
    while time.process_time() - cpu_began < 0.2:
        pass
    print("wall", time.monotonic() - began)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="the kernel does not say how long a task waited")
def test_time_spent_waiting_for_a_cpu_is_not_the_tests():
    """A test slowed by other processes on its CPU (a busy CI machine) stays within the limit; the hook leaves out
    the time its thread waited on the run queue. Sleeping is not waiting (the test above still fails)."""
    r = _crowded(CROWDED)
    assert "1 passed" in r.stdout, r.stdout + r.stderr


#: the same, with the computing done by a second thread while the test's own thread waits for it to end (as ONNX
#: Runtime's pool threads compute while the test waits in ``run``): only the second thread waits for the CPU
CROWDED_THREAD = CROWDED.replace(
    """def test_crowded(crowd):
    began, cpu_began = time.monotonic(), time.process_time()
    while time.process_time() - cpu_began < 0.2:
        pass
    print("wall", time.monotonic() - began)""",
    """def test_crowded(crowd):
    import threading

    def work():
        cpu_began = time.thread_time()
        while time.thread_time() - cpu_began < 0.2:
            pass

    began = time.monotonic()
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    print("wall", time.monotonic() - began)""",
)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the kernel does not say how long a thread waited")
def test_time_another_thread_of_the_test_waited_for_a_cpu_scales_the_limit():
    """Was: a fixed factor of the load average; a test whose ONNX Runtime threads waited took 1.82 s with 0.19 s
    of its own thread's wait and failed. Now the limit grows by the wait its threads measured."""
    assert CROWDED_THREAD != CROWDED
    r = _crowded(CROWDED_THREAD)
    assert "1 passed" in r.stdout, r.stdout + r.stderr


#: the same, with the computing done by a child process while the test waits for it (as ``python -m runner`` in a
#: test of the command line): the child waits for the CPU, and its figures are read while it lives
CROWDED_CHILD = CROWDED.replace(
    """def test_crowded(crowd):
    began, cpu_began = time.monotonic(), time.process_time()
    while time.process_time() - cpu_began < 0.2:
        pass
    print("wall", time.monotonic() - began)""",
    """def test_crowded(crowd):
    spin = "import time\\nbegan = time.process_time()\\nwhile time.process_time() - began < 0.2: pass"
    began = time.monotonic()
    subprocess.run([sys.executable, "-S", "-c", spin], check=True)
    print("wall", time.monotonic() - began)""",
)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="the kernel does not say how long a thread waited")
def test_time_a_child_process_of_the_test_waited_for_a_cpu_scales_the_limit():
    """Issue 74: a test whose work runs in a child process took 3.99 s on a busy machine against 1.5 s, the child's
    wait unseen. Now the child's threads are read as the test's own."""
    assert CROWDED_CHILD != CROWDED
    r = _crowded(CROWDED_CHILD)
    assert "1 passed" in r.stdout, r.stdout + r.stderr


def _crowded(test_source: str) -> subprocess.CompletedProcess:
    """Run ``test_source`` (a test that spins while other processes crowd its CPU) under the hooks at a 0.4 s limit;
    skip when the crowd did not slow it (nothing to measure)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "conftest.py").write_text(HOOKS)
        (Path(tmp) / "test_crowded.py").write_text(test_source)
        env = {**os.environ, "RUNNER_FAST_TEST_LIMIT_S": "0.4", "PYTHONPATH": str(ROOT)}
        r = subprocess.run([*PYTEST, "-s", tmp], cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    assert "wall " in r.stdout, r.stdout + r.stderr
    wall = float(r.stdout.split("wall ")[1].split()[0])
    if wall < 0.6:
        pytest.skip(f"the spinning processes did not crowd the test's CPU ({wall:.2f} s): nothing to measure")
    return r
