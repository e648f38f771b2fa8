"""``executor=processes``: checks in worker processes the run starts itself (one spawned
``ProcessPoolExecutor`` each). On CPU, with the compare checker: the serial answer, each check on
the worker of its slot, no worker process left after Ctrl-C or ``kill -9``, and a stopped run
resumes to the same answer."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

from examples.planted import GRAPHS
from runner.errors import ConfigError
from runner.executors.processes import ProcessExecutor
from runner.executors.slot import visible_gpu
from runner.executors.worker import warm_model
from tests.helpers.cli import alive, replay_iterations, start_process, wait_for

#: every check in a worker process (the tests of the workers themselves)
PROCESSES = ["executor=processes", "executor.workers=2", "executor.local_start=false"]
COMPARE = ["checker=compare", "checker.backend=fp16_emulation", "checker.atol=1e-3", "checker.rtol=1e-2"]

#: a python check that notes its worker process, sleeps as long as ``delay`` says, then passes
#: while the model lacks the named nodes (a reduce's check)
SLOW_CHECK = """
import os, pathlib, time
import onnx

def check(path, pids, delay, *names):
    n = os.environ.get("RUNNER_ITERATION") or str(time.monotonic_ns())
    part = pathlib.Path(pids, "part" + n)  # written whole, then renamed: a reader never sees it half-written
    part.write_text(str(os.getpid()))
    part.replace(pathlib.Path(pids, "pid" + n))
    time.sleep(float(pathlib.Path(delay).read_text()))
    present = {node.name for node in onnx.load(path, load_external_data=False).graph.node}
    return not set(names) <= present
"""


def _planted(tmp_path, name="two_branches"):
    model, needed, scale = GRAPHS[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=(scale * (1 + np.random.default_rng(0).random((1, 8)))).astype(np.float32))
    return path, inputs, needed


@pytest.mark.slow
@pytest.mark.parametrize("marker", ["bisect", "minimal"])
def test_compare_checks_in_worker_processes_give_the_serial_answer(run, tmp_path, marker):
    path, inputs, needed = _planted(tmp_path)
    args = ["mode=precision", f"model={path}", f"inputs={inputs}", f"marker={marker}", *COMPARE]
    serial = run(*args)
    parallel = run(*args, *PROCESSES)
    assert serial.returncode == 0 and parallel.returncode == 0, parallel.stderr[-3000:]
    assert parallel.summary["kept_nodes"] == serial.summary["kept_nodes"]
    if marker == "minimal":
        assert sorted(n["name"] for n in parallel.summary["kept_nodes"]) == sorted(needed)
    assert parallel.summary["executor"] == "processes" and parallel.summary["workers"] == 2
    assert parallel.summary["answer_verified"]["check_passed"] is True
    assert parallel.summary["rounds"] <= serial.summary["rounds"]


@pytest.mark.slow
def test_each_check_runs_on_the_worker_of_its_slot(tmp_path):
    """Slot i's check runs in worker process i (the one pinned to slot i's GPU), and a worker keeps
    the checker it was sent between checks."""
    executor = ProcessExecutor(workers=2)
    try:
        pids = [executor.submit(_pid, worker=w).result(timeout=60) for w in (0, 1, 0, 1)]
        assert pids[0] == pids[2] and pids[1] == pids[3] and pids[0] != pids[1]
        shared = executor.share(_Counter())
        counts = [executor.submit(_count, shared, worker=0).result(timeout=60) for _ in range(3)]
        assert counts == [1, 2, 3], "the worker keeps one checker object between checks"
    finally:
        executor.close()
    assert not any(alive(pid) for pid in set(pids)), "close() stops the worker processes"


def test_process_executor_options_are_checked():
    with pytest.raises(ConfigError, match="per_gpu=0"):
        ProcessExecutor(per_gpu=0)
    with pytest.raises(ConfigError, match="starts 4 workers"):
        ProcessExecutor(workers=3, gpus=[0, 1], per_gpu=2)
    with pytest.raises(ConfigError, match="start=later must be lazy"):
        ProcessExecutor(start="later", local_start=False)  # refused whatever local_start says
    with pytest.raises(ConfigError, match=r"auto is now lazy"):
        ProcessExecutor(start="auto")


#: a runner stand-in: starts two worker processes, prints their process ids, then waits to be killed
ORPHANING = """
import os, sys, time
from runner.executors.processes import ProcessExecutor

def pid():
    return os.getpid()

if __name__ == "__main__":
    executor = ProcessExecutor(workers=2, start="now")
    print(*[executor.submit(pid, worker=w).result(timeout=60) for w in (0, 1)], flush=True)
    time.sleep(60)
"""


@pytest.mark.slow
def test_workers_end_when_the_runner_is_killed_outright(tmp_path):
    """``kill -9`` of the runner: its worker processes see their parent gone and end within a second."""
    script = tmp_path / "orphaning.py"
    script.write_text(ORPHANING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    runner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        workers = [int(p) for p in runner.stdout.readline().split()]
        assert len(workers) == 2 and all(alive(p) for p in workers)
    finally:
        runner.kill()
        runner.wait()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in workers), "the workers outlived a killed runner"


def test_the_warm_up_model_loads_in_runtimes_older_than_the_installed_onnx():
    """``make_model`` writes the installed onnx's IR version (14 with onnx 1.20), which ONNX Runtime 1.31
    refuses: the warm-up pins IR 7 and runs."""
    import onnxruntime as ort

    model = warm_model()
    assert model.ir_version == 7
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((1, 1, 4, 4), np.float32)}
    )
    assert got[0].shape == (1, 1, 4, 4)


def test_gpus_are_numbered_as_this_process_sees_them(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpu("0") == "2" and visible_gpu("1") == "3"
    with pytest.raises(ConfigError, match="sees 2"):
        visible_gpu("2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu("1") == "1"


@pytest.mark.slow
def test_ctrl_c_leaves_no_worker_process_and_the_run_resumes(run, tmp_path, chain, on_path):
    (tmp_path / "slowcheck.py").write_text(SLOW_CHECK)
    importlib.invalidate_caches()  # on_path: python -m runner finds it in its working directory
    pids, delay = tmp_path / "pids", tmp_path / "delay"
    pids.mkdir()
    check = ["checker=python", "checker.target=slowcheck.check", f"checker.args=[{pids},{delay},n2,n5]"]
    reduce = ["mode=reduce", f"model={chain}", *check, *PROCESSES]
    delay.write_text("0")
    full = run(*reduce)
    assert full.returncode == 0, full.stderr[-3000:]
    assert [n["name"] for n in full.summary["reduced_nodes"]] == ["n2", "n5"]
    for p in pids.glob("pid*"):
        p.unlink()

    # Ctrl-C while the workers sleep in their checks
    delay.write_text("30")
    stopped = tmp_path / "interrupted"
    proc = start_process(tmp_path, *reduce, run_dir=stopped)
    wait_for(lambda: len(list(pids.glob("pid*"))) >= 2, proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert json.loads((stopped / "summary.json").read_text())["status"] == "interrupted"
    workers = {int(p.read_text()) for p in pids.glob("pid*")}
    assert workers and not any(alive(pid) for pid in workers), "no worker process is left behind"

    # a run stopped after some checks resumes from its replay to the same answer
    for p in pids.glob("pid*"):
        p.unlink()
    delay.write_text("0.3")
    second = tmp_path / "stopped"
    proc = start_process(tmp_path, *reduce, run_dir=second)
    replay = second / "replay.json"
    wait_for(lambda: replay_iterations(replay) >= 3, proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    done = replay_iterations(replay)
    delay.write_text("0")
    resumed = run(*reduce, f"replay.load={replay}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["reduced_nodes"] == full.summary["reduced_nodes"]
    assert resumed.summary["reused"] >= min(done, 1)


#: a python check that notes its process, waits while the file ``hold`` exists, then passes while
#: the model lacks the named nodes
HELD_CHECK = """
import os, pathlib, time
import onnx

def check(path, pids, hold, *names):
    part = pathlib.Path(pids, f"part{time.monotonic_ns()}")  # written whole, then renamed: never read half-written
    part.write_text(str(os.getpid()))
    part.replace(part.with_name("pid" + part.name[4:]))
    while pathlib.Path(hold).exists():
        time.sleep(0.01)
    present = {node.name for node in onnx.load(path, load_external_data=False).graph.node}
    return not set(names) <= present
"""


@pytest.mark.slow
def test_rounds_before_the_workers_are_ready_run_here_and_the_rest_on_them(run, tmp_path, chain, on_path):
    """executor.local_start (the default): the first round (two checks) starts long before two worker
    processes can be ready and runs in the runner's own process; it is held until the log says the workers
    are ready, and every later check runs in a worker process. Same answer as serial."""
    (tmp_path / "heldcheck.py").write_text(HELD_CHECK)
    importlib.invalidate_caches()
    pids, hold = tmp_path / "pids", tmp_path / "hold"
    pids.mkdir()
    check = ["checker=python", "checker.target=heldcheck.check", f"checker.args=[{pids},{hold},n2,n5]"]
    reduce = ["mode=reduce", f"model={chain}", *check]
    serial = run(*reduce)
    assert serial.returncode == 0, serial.stderr[-3000:]
    for p in pids.glob("pid*"):
        p.unlink()

    hold.write_text("")
    run_dir = tmp_path / "processes"
    processes = ["executor=processes", "executor.workers=2", "executor.start=now"]
    proc = start_process(tmp_path, *reduce, *processes, run_dir=run_dir)
    wait_for(lambda: len(list(pids.glob("pid*"))) >= 2, proc)
    first = {int(p.read_text()) for p in pids.glob("pid*")}
    assert first == {proc.pid}, "the first round's checks run in the runner's process"
    log = run_dir / "runner.log"
    wait_for(lambda: log.exists() and "worker processes ready" in log.read_text(), proc)
    hold.unlink()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reduced_nodes"] == serial.summary["reduced_nodes"]
    assert summary["local_checks"] == 2 and summary["checks"] > 2
    assert 0 < summary["workers_started_s"] < 5, "executor.start=now: with the run"
    later = [int(p.read_text()) for p in sorted(pids.glob("pid*"))][2:]
    assert later and proc.pid not in later, "once the workers are ready, every check runs on them"
    assert not any(alive(pid) for pid in later), "the run's end stops the workers"


@pytest.mark.slow  # two runs, one setting up the process executor: 1.2-1.6 s on 2 loaded cores, past 1.5 s
def test_a_run_of_cheap_checks_never_starts_the_workers(run, tmp_path, monkeypatch):
    """executor.start=lazy (the default): a ranking and checks of milliseconds never pay for worker
    processes; all of it runs here and no worker starts. Same answer as serial. (The threshold is raised to
    5 s: a loaded test machine can stretch a millisecond check past 1 s.)"""
    from runner.executors import processes

    monkeypatch.setattr(processes, "DEAR_S", 5.0)
    path, inputs, _ = _planted(tmp_path)
    args = ["mode=precision", f"model={path}", f"inputs={inputs}", *COMPARE]
    serial = run(*args)
    result = run(*args, "executor=processes", "executor.workers=2", run_dir=tmp_path / "processes")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["kept_nodes"] == serial.summary["kept_nodes"]
    assert result.summary["local_checks"] == result.summary["checks"] > 2
    assert result.summary["workers_started_s"] is None
    log = (tmp_path / "processes" / "runner.log").read_text()
    assert "2 worker processes: they start once a check here takes 5 s or more" in log
    assert "starting the 2 worker processes" not in log


#: a python check that writes 256 KB to standard output and to standard error (ONNX Runtime's CUDA
#: provider warns on stderr at every session), then passes while the model lacks the named nodes
LOUD_CHECK = """
import sys
import onnx

def check(path, *names):
    sys.stdout.write("o" * 262144 + "\\n")
    sys.stderr.write("e" * 262144 + "\\n")
    present = {node.name for node in onnx.load(path, load_external_data=False).graph.node}
    return not set(names) <= present
"""


@pytest.mark.slow
def test_checks_that_write_much_output_in_the_workers_do_not_stall_the_run(run_cli, tmp_path, chain):
    """The workers' standard output and error are the runner's, never a pipe nobody reads (which stalled a
    GPU run once ONNX Runtime's warnings filled it)."""
    (tmp_path / "loudcheck.py").write_text(LOUD_CHECK)
    r = run_cli(
        "mode=reduce",
        f"model={chain}",
        "checker=python",
        "checker.target=loudcheck.check",
        "checker.args=[n2,n5]",
        *PROCESSES,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert [n["name"] for n in r.summary["reduced_nodes"]] == ["n2", "n5"]


@pytest.mark.slow
def test_workers_that_cannot_start_in_time_are_one_line(tmp_path):
    executor = ProcessExecutor(workers=1, timeout_s=0.001, local_start=False)
    try:
        with pytest.raises(ConfigError, match=r"did not start within executor.timeout_s=0\.001 s"):
            executor.submit(_pid, worker=0)
    finally:
        executor.close()


def _pid() -> int:
    import os

    return os.getpid()


class _Counter:
    """Counts the calls it receives: the stand-in for a checker's state kept between checks."""

    in_process = True

    def __init__(self):
        self.n = 0


def _count(counter: _Counter) -> int:
    counter.n += 1
    return counter.n


@pytest.mark.slow
def test_a_check_that_kills_its_worker_stops_the_run_without_a_verdict(run, chain):
    """The worker dies in the check: no verdict is made up and the check is not run again. The
    first round checks iterations 1 and 2 at once; the error names whichever death came in first."""
    r = run("mode=reduce", f"model={chain}", "checker=python", "checker.target=tests.helpers.checks.dies", *PROCESSES)
    assert r.returncode == 2
    assert re.search(r"iteration [12]: the check's worker process died", r.stderr), r.stderr[-2000:]
    replay = r.run_dir / "replay.json"
    assert not replay.exists() or not json.loads(replay.read_text())["iterations"]


def test_a_check_command_is_refused_with_the_executor_that_runs_it(run, chain):
    """A check command is its own process: worker processes add nothing and could not stop it when its round no
    longer needs it; the run says so in one line before any check."""
    r = run("mode=reduce", f"model={chain}", "checker.cmd=true", "executor=processes", "executor.workers=2")
    assert r.returncode == 2 and "use executor=local" in r.stderr and r.summary["checks"] == 0
