"""Shared fixtures: ``run`` (a job in-process), ``run_cli`` (``python -m runner`` in a subprocess), check scripts.

Builders live in ``tests/helpers/``; mode tests use ``run``, and ``run_cli`` is kept for what only a
process shows (exit codes, signals, stdout, the README's commands).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator

import onnx
import pytest

from tests.helpers.cli import HAS_NODES, RunResult, run_process, write_script
from tests.helpers.inprocess import run_in_process
from tests.helpers.int8 import write_loader
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


#: seconds an unmarked test may take (its call, not its fixtures); RUNNER_FAST_TEST_LIMIT_S overrides it
FAST_LIMIT_S = float(os.environ.get("RUNNER_FAST_TEST_LIMIT_S", "1.5"))
#: the seconds a test's call ran and waited for a CPU (``_threads_s``), kept for its report
_CPU = pytest.StashKey[tuple]()


def _threads_s() -> dict:
    """``{thread id: (seconds run on a CPU, seconds waited on a run queue for one)}`` of this process's threads and
    of its child processes' (and theirs: a test that runs ``python -m runner``, whose check runs a script), read
    from Linux's ``/proc/<pid>/task/*/schedstat`` (first two fields, nanoseconds; children from
    ``/proc/<pid>/task/*/children``); empty where the kernel does not say. A child's threads are keyed
    ``pid:tid``; its figures are what was last read before it ended."""
    found: dict = {}
    pending, seen = ["self"], set()
    while pending:
        pid = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # a child that ended meanwhile
        for tid in tasks:
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{base}/schedstat") as f:
                    ran, waited = f.read().split()[:2]
                found[tid if pid == "self" else f"{pid}:{tid}"] = (int(ran) / 1e9, int(waited) / 1e9)
                with open(f"{base}/children") as f:
                    children = f.read().split()
            except (OSError, ValueError):
                continue  # a thread that ended meanwhile, or a kernel without the children file
            pending.extend(c for c in children if c not in seen)
            seen.update(children)
    return found


def _spent(before: dict, after: dict) -> tuple:
    """(seconds run, seconds waited) by the threads of ``after`` since ``before`` (a new thread from 0)."""
    ran = sum(r - before.get(t, (0.0, 0.0))[0] for t, (r, _) in after.items())
    waited = sum(w - before.get(t, (0.0, 0.0))[1] for t, (_, w) in after.items())
    main = str(threading.get_native_id())
    own = after.get(main, (0.0, 0.0))[1] - before.get(main, (0.0, 0.0))[1]
    return max(ran, 0.0), max(waited, 0.0), max(own, 0.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Note how long the test's threads ran and waited for a CPU: the wait is time other processes took. A thread
    that ends during the test takes its figures with it, so they are read every ``_SAMPLE_S`` meanwhile."""
    before = _threads_s()
    seen = dict(before)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(_SAMPLE_S):
            seen.update(_threads_s())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        seen.update(_threads_s())
        seen.pop(str(sampler.native_id), None)
        item.stash[_CPU] = _spent(before, seen)


#: seconds between two readings of the test's threads' figures
_SAMPLE_S = 0.05


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fail an unmarked test whose call took more than ``FAST_LIMIT_S``: the inner loop (``-m "not slow"``) stays
    fast only if a slow test says so (``@pytest.mark.slow``). What the machine's other work cost the test is
    measured, not guessed from the load: the time the call's own thread waited for a CPU is left out (a 0.7 s
    test took 1.8 s on a busy machine), and the limit grows by the share of its threads' time they spent
    waiting (ONNX Runtime's pool threads wait too: 1.82 s with 0.19 s of the main thread's wait)."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or item.get_closest_marker("slow"):
        return
    ran, waited, own = item.stash.get(_CPU, (0.0, 0.0, 0.0))
    slower = 1.0 + (waited - own) / ran if ran > 0 else 1.0  # the other threads' wait per second they ran
    if call.duration - own > FAST_LIMIT_S * slower:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.2f} s"
            f"{f' ({own:.2f} s of it waiting for a CPU)' if own >= 0.01 else ''}, over the {FAST_LIMIT_S} s "
            f"of an unmarked test{f' (x{slower:.2f} for its threads waiting)' if slower > 1.005 else ''}: make it "
            "faster or mark it @pytest.mark.slow"
        )


ROOT = Path(__file__).resolve().parents[1]
#: what a test session may add to the repository's top level (pytest's and Python's own caches)
_ROOT_MAY_GET = {".pytest_cache", "__pycache__"}
_ROOT_ENTRIES = pytest.StashKey[set]()


_SHARED_SUMS = pytest.StashKey[dict]()


def shared_model_sums() -> dict:
    """``{file name: sha256}`` of every file in the shared models folder and its ``zoo/`` (empty without it)."""
    import hashlib

    from tests.helpers.models import MODELS

    if not MODELS.is_dir():
        return {}
    files = [p for p in sorted(MODELS.rglob("*")) if p.is_file()]
    return {str(p.relative_to(MODELS)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def pytest_sessionstart(session) -> None:
    session.config.stash[_ROOT_ENTRIES] = set(os.listdir(ROOT))
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_SHARED_SUMS] = shared_model_sums()
    # a suite started in the background of a non-interactive shell (``pytest &`` in a script) inherits
    # SIGINT ignored, and so would every run it starts: the tests that press Ctrl-C on a run then wait in
    # vain. Runs started from here get SIGINT as a terminal gives it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run when a test wrote into the repository's top level (a run without ``output=`` or a run
    directory of its own writes ``reduced.onnx`` or ``outputs/`` where the tests started): a test
    writes under its ``tmp_path``. Checked once, by the process that started the workers."""
    if hasattr(session.config, "workerinput"):
        return
    added = sorted(set(os.listdir(ROOT)) - session.config.stash[_ROOT_ENTRIES] - _ROOT_MAY_GET)
    if added:
        sys.stderr.write(f"\nerror: the tests wrote into {ROOT}: {', '.join(added)}; write under tmp_path\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    before, after = session.config.stash[_SHARED_SUMS], shared_model_sums()
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    if changed:
        sys.stderr.write(f"\nerror: the tests changed the shared models: {', '.join(changed)}; hand tools a copy\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def small_maps(monkeypatch, tmp_path):
    """Models of 4 KB of weights map; tensors of 1 KB go to a fresh weight file in ``tmp_path``
    (``runner.graph.weight_file``): a large model's code paths on small models."""
    from runner.graph import weight_file as wf

    monkeypatch.setattr(wf, "MAP_BYTES", 4096)
    monkeypatch.setattr(wf, "POINT_BYTES", 1024)
    monkeypatch.setattr(wf, "_shared", wf.WeightFile())
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))


@pytest.fixture
def run(tmp_path):
    """Run a job in this process (compose + ``runner.run.app.run``), its run dir in tmp, cwd tmp."""
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


@pytest.fixture
def on_path(tmp_path) -> Iterator[Path]:
    """``tmp_path`` on ``sys.path`` for the test, as the working directory is for ``python -m runner`` (a
    ``data_loader=`` or ``checker.target=`` module written there imports). Only that entry is taken off
    afterwards: restoring the whole of ``sys.path`` (``monkeypatch.syspath_prepend``) also drops what a
    library added meanwhile, such as ``onnxruntime.transformers``' own directory, without which a later
    ``import onnxruntime.quantization`` fails (``No module named 'fusion_utils'``)."""
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    with contextlib.suppress(ValueError):
        sys.path.remove(str(tmp_path))


@pytest.fixture
def int8_feeds(on_path, monkeypatch) -> str:
    """The planted-outlier graph's data loader module (``tests.helpers.int8``), importable for the test."""
    name = write_loader(on_path)
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@pytest.fixture(scope="session")
def dask_cluster() -> Iterator[str]:
    """A Dask ``LocalCluster`` of two worker processes for the tests of this pytest process (the executor
    tests and the documents' commands share it): its scheduler's address."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    yield cluster.scheduler_address
    cluster.close()
