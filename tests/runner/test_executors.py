"""Parallel checks (issue 13): ``executor=local`` and ``executor=dask`` give the serial answer in fewer
rounds, record every check, cancel what a round no longer needs and everything on Ctrl-C, and resume."""

from __future__ import annotations

import json
import re
import signal
import time

import numpy as np
import onnx
import pytest

from tests.helpers.checks import python_check
from tests.helpers.cli import (
    NODE_NAMES,
    alive,
    check_cmd,
    one_line_error,
    replay_iterations,
    start_process,
    wait_for,
    write_script,
)
from tests.helpers.models import DETECTOR, need, overflow_model

LOCAL4 = ["executor=local", "executor.workers=4"]


def _reduced(r) -> list:
    assert r.returncode == 0, r.stderr[-3000:]
    return r.summary["reduced_nodes"]


@pytest.mark.parametrize("marker", ["bisect", "linear", "minimal"])
@pytest.mark.slow
def test_local_reduce_gives_the_serial_answer_in_fewer_rounds(run, chain, marker):
    args = ["mode=reduce", f"model={chain}", f"marker={marker}", *python_check("n2", "n5")]
    serial = run(*args)
    parallel = run(*args, *LOCAL4)
    assert _reduced(parallel) == _reduced(serial)
    s = parallel.summary
    assert s["executor"] == "local" and s["workers"] == 4
    assert s["rounds"] < serial.summary["rounds"] == serial.summary["checks"]
    # every check that ended is in the replay; the cancelled ones are counted apart (a candidate met again, as
    # the answer's prune pass may, is reused from this run's replay and recorded as reused)
    checked = [e for e in parallel.replay["iterations"] if not e["reused"]]
    assert len(checked) == s["checks"] - s.get("cancelled", 0)


@pytest.mark.parametrize("marker", ["bisect", "minimal"])
@pytest.mark.slow
def test_local_precision_with_the_compare_checker_gives_the_serial_answer(run, tmp_path, marker):
    """In-process compare checks on threads (shared ONNX Runtime session cache) keep the same nodes."""
    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), path)
    args = ["mode=precision", f"model={path}", f"marker={marker}", "checker=compare", "checker.backend=fp16_emulation"]
    serial = run(*args)
    parallel = run(*args, *LOCAL4)
    assert serial.returncode == 0 and parallel.returncode == 0, parallel.stderr[-3000:]
    assert parallel.summary["kept_nodes"] == serial.summary["kept_nodes"]
    assert parallel.summary["rounds"] <= serial.summary["rounds"]


@pytest.mark.slow
def test_a_non_monotone_check_gets_the_serial_answer_from_any_number_of_workers(run, tmp_path):
    """The detector's fp16 reduce on CPU with an absolute tolerance: subgraphs that end at large
    tensors fail, longer ones can pass, so the check is not monotone in the bisect's index. With 2
    workers the answer was once 3 nodes in 34 checks against the serial 1 in 12 (a (k+1)-ary split
    met other verdicts); bisect's rounds now follow the serial search's path."""
    inputs = tmp_path / "pixels.npz"
    np.savez(inputs, x=(np.random.default_rng(0).random((1, 3, 320, 320)) * 255).astype(np.float32))
    args = [
        "mode=reduce",
        f"model={need(DETECTOR)}",
        f"inputs={inputs}",
        "checker=compare",
        "checker.low_precision=float16",
        "checker.atol=0.05",
        "checker.rtol=0",
        "checker.max_mismatch_fraction=0.01",
    ]
    serial = run(*args)
    assert [n["name"] for n in _reduced(serial)] == ["p2o.Conv.0"]
    for workers in (2, 3):
        parallel = run(*args, "executor=local", f"executor.workers={workers}")
        assert _reduced(parallel) == _reduced(serial)
        assert parallel.summary["checks"] <= serial.summary["checks"] + workers
        assert parallel.summary["rounds"] < serial.summary["rounds"]


@pytest.mark.slow
def test_the_next_rounds_candidates_are_built_while_a_round_is_checked(run, chain):
    """Look-ahead: the candidates of later rounds were built during the round before (the log says
    how many per round); the answer is the serial one, and ``executor.lookahead=false`` builds none ahead."""
    slow = ["checker=python", "checker.target=tests.helpers.checks.lacks_nodes_slowly", "checker.args=[0.2,n2,n5]"]
    args = ["mode=reduce", f"model={chain}", "marker=bisect", *slow, "executor=local", "executor.workers=2"]
    ahead = run(*args)
    plain = run(*args, "executor.lookahead=false")
    assert _reduced(ahead) == _reduced(plain)
    log = (ahead.run_dir / "runner.log").read_text()
    built = re.findall(r"Round (\d+): (\d+) of (\d+) candidates were built ahead", log)
    assert len(built) >= ahead.summary["rounds"] // 2, built
    assert all(int(r) > 1 for r, _, _ in built)  # the first round has no round before it
    assert "built ahead" not in (plain.run_dir / "runner.log").read_text()


@pytest.mark.slow
def test_one_threaded_worker_builds_the_next_candidates_while_a_check_runs(run, chain):
    """``executor=local executor.workers=1``: the serial search (the same checks and answer), its candidates built
    on the runner's thread, the next round's during the check before (``Executor.threaded``); serial builds none
    ahead."""
    slow = ["checker=python", "checker.target=tests.helpers.checks.lacks_nodes_slowly", "checker.args=[0.2,n2,n5]"]
    args = ["mode=reduce", f"model={chain}", "marker=bisect", *slow]
    serial = run(*args)
    one = run(*args, "executor=local", "executor.workers=1")
    assert _reduced(one) == _reduced(serial) and one.summary["checks"] == serial.summary["checks"]
    assert one.summary["rounds"] == serial.summary["rounds"] and one.summary["workers"] == 1
    built = re.findall(
        r"Round (\d+): (\d+) of (\d+) candidates were built ahead", (one.run_dir / "runner.log").read_text()
    )
    assert built and all(int(r) > 1 and int(of) == 1 for r, _, of in built), built
    assert "built ahead" not in (serial.run_dir / "runner.log").read_text()


def test_repeat_until_bad_cancels_the_rest_of_its_round(run, tmp_path):
    """Runs 4-6 share a round; run 5 fails, so run 6 (which would sleep a minute) is cancelled and killed."""
    script = write_script(
        tmp_path / "flaky.py",
        "import os, sys, time\n"
        "n = os.environ['RUNNER_ITERATION']\n"
        "open(os.path.join(sys.argv[1], 'pid' + n), 'w').write(str(os.getpid()))\n"
        "if n == '6': time.sleep(60)\n"
        "sys.exit(1 if n == '5' else 0)\n",
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    started = time.monotonic()
    r = run("mode=repeat", "until=bad", check_cmd(script, str(pids)), "executor=local", "executor.workers=3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert time.monotonic() - started < 30
    s = r.summary
    assert (s["runs"], s["good"], s["bad"]) == (5, 4, 1)
    assert s["checks"] == 6 and s["cancelled"] == 1 and s["rounds"] == 2
    assert [e["iteration"] for e in r.replay["iterations"]] == [1, 2, 3, 4, 5]
    pid6 = pids / "pid6"  # absent when run 6 was cancelled before its process wrote it
    assert not pid6.exists() or not pid6.read_text() or not alive(int(pid6.read_text()))


def test_each_worker_writes_its_own_artifacts(run, tmp_path):
    """``{worker}`` in artifacts.paths and checker.cmd: every check's file is sorted, none overwritten."""
    script = write_script(
        tmp_path / "writes.py",
        "import os, sys\n"
        "open(sys.argv[1], 'w').write(os.environ['RUNNER_ITERATION'] + ' ' + os.environ['RUNNER_WORKER'])\n",
    )
    art = tmp_path / "art"
    r = run(
        "mode=repeat",
        "until=6",
        check_cmd(script, str(tmp_path / "out_{worker}.txt")),
        f"artifacts.paths=['{tmp_path / 'out_{worker}.txt'}']",
        f"artifacts.dir={art}",
        *LOCAL4,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    kept = sorted(p.read_text() for p in (art / "good").iterdir())
    assert sorted(int(k.split()[0]) for k in kept) == [1, 2, 3, 4, 5, 6]
    assert {k.split()[1] for k in kept} <= {"0", "1", "2", "3"}


@pytest.mark.parametrize(
    "args, words",
    [
        (["executor.workers=3"], ["executor.workers=3", "executor=local"]),
        (["checker=interactive", *LOCAL4], ["interactive", "executor=serial"]),
        ([*LOCAL4, "artifacts.paths=[trt.log]"], ["artifacts.paths", "{worker}"]),
        (["executor=local", "executor.workers=0"], ["executor.workers=0"]),
        (["executor=local", "executor.workers=3", "executor.gpus=[0,1]"], ["2 GPUs", "executor.workers=2"]),
        (["executor=dask"], ["executor.address"]),
        (["executor=dask", "executor.address=tcp://127.0.0.1:9", "executor.timeout_s=1"], ["cannot reach", "Dask"]),
    ],
)
@pytest.mark.slow
def test_bad_executor_options_are_one_line_errors(run, chain, args, words):
    check = [] if "checker=interactive" in args else python_check("n2")
    r = run("mode=reduce", f"model={chain}", *check, *args)
    one_line_error(r, *words, code=2)
    assert onnx.load(str(chain)).graph.node  # the model is untouched


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["executor=serial", "executor.gpus=[0]"],
            ["executor.gpus=", "executor=serial", "executor=dask, executor=local"],
        ),
        (["executor=local", "executor.address=tcp://x:1"], ["executor.address=", "executor=local", "executor=dask"]),
        (["executor=local", "executor.timeout_s=5"], ["executor.timeout_s=", "executor=dask, executor=processes"]),
        (["executor=processes", "executor.start=auto"], ["executor.start=auto", "lazy, now"]),
        (["checker.atol=1"], ["checker.atol= is not used by checker=python", "checker=compare"]),
    ],
)
@pytest.mark.slow
def test_a_key_of_another_executor_or_checker_is_a_one_line_error(run_cli, chain, args, words):
    """Each executor has its own schema, so its keys are checked when the config is composed: a key of
    another executor (or checker) names the chosen one and those that take it."""
    r = run_cli("mode=reduce", f"model={chain}", *python_check("n2"), *args)
    one_line_error(r, *words, code=2)


def test_a_check_gets_its_gpu(run, tmp_path):
    script = write_script(
        tmp_path / "gpu.py",
        "import os, sys\n"
        "sys.exit(0 if os.environ['CUDA_VISIBLE_DEVICES'] == 'gpu' + os.environ['RUNNER_WORKER'] else 1)\n",
    )
    r = run("mode=repeat", "until=4", check_cmd(script), "executor=local", "executor.gpus=[gpu0,gpu1]")
    assert r.returncode == 0 and r.summary["good"] == 4 and r.summary["workers"] == 2, r.stderr[-2000:]


SLOW_CHECK = (
    NODE_NAMES
    + """
import time
n = os.environ["RUNNER_ITERATION"]
part = os.path.join(sys.argv[2], "part" + n)  # written whole, then renamed: a reader never sees it half-written
with open(part, "w") as f:
    f.write(str(os.getpid()))
os.replace(part, os.path.join(sys.argv[2], "pid" + n))
time.sleep(float(open(sys.argv[3]).read()))  # a file: the command (the replay identity) stays the same
sys.exit(1 if {"n2", "n5"} <= node_names(sys.argv[1]) else 0)
"""
)


@pytest.mark.slow
def test_ctrl_c_cancels_every_running_check_and_a_resumed_run_ends_the_same(run, tmp_path, chain):
    script = write_script(tmp_path / "slow.py", SLOW_CHECK)
    pids = tmp_path / "pids"
    pids.mkdir()
    delay = tmp_path / "delay"
    reduce = ["mode=reduce", f"model={chain}", "executor=local", "executor.workers=3"]
    check = check_cmd(script, "{artifact}", str(pids), str(delay))
    delay.write_text("0")
    full = run(*reduce, check)
    for p in pids.glob("pid*"):
        p.unlink()

    # a slow run: the gates round ends, then Ctrl-C while the next round's three checks run
    first = tmp_path / "interrupted"
    delay.write_text("30")
    proc = start_process(tmp_path, *reduce, check, run_dir=first)
    wait_for(lambda: len(list(pids.glob("pid*"))) >= 1, proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert json.loads((first / "summary.json").read_text())["status"] == "interrupted"
    started = [int(p.read_text()) for p in pids.glob("pid*")]
    assert started and not any(alive(pid) for pid in started)

    # finished checks are kept: stop a quick run mid-way, then resume it
    second = tmp_path / "stopped"
    for p in pids.glob("pid*"):
        p.unlink()
    delay.write_text("0.2")
    proc = start_process(tmp_path, *reduce, check, run_dir=second)
    replay = second / "replay.json"
    wait_for(lambda: replay_iterations(replay) >= 4, proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    done = replay_iterations(replay)
    delay.write_text("0")
    resumed = run(*reduce, check, f"replay.load={replay}")
    assert _reduced(resumed) == _reduced(full)
    assert resumed.summary["reused"] >= min(done, 1)


@pytest.mark.slow
def test_dask_cluster_gives_the_serial_answer(run, tmp_path, chain, has_nodes_script, dask_cluster):
    """A LocalCluster of two worker processes: in-process checks (the python checker, the compare
    checker with its golden values) ship the checker and the candidate; command checks share the disk."""
    dask = ["executor=dask", f"executor.address={dask_cluster}"]
    base = ["mode=reduce", f"model={chain}"]
    for check in (python_check("n2", "n5"), [check_cmd(has_nodes_script, "{artifact}", "n2", "n5")]):
        parallel = run(*base, *check, *dask)
        assert [n["name"] for n in _reduced(parallel)] == ["n2", "n5"]  # the serial answer (test_reduce)
        assert parallel.summary["executor"] == "dask" and parallel.summary["workers"] == 2
        assert parallel.summary["rounds"] < parallel.summary["checks"]

    path = tmp_path / "overflow.onnx"
    onnx.save(overflow_model(), path)
    compare = ["mode=precision", f"model={path}", "checker=compare", "checker.backend=fp16_emulation"]
    assert run(*compare, *dask).summary["kept_nodes"] == run(*compare).summary["kept_nodes"]

    import distributed

    with distributed.Client(dask_cluster) as client:  # the cancel flags of settled rounds were cleared
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.extensions["events"]._events)) == 0


def test_a_relayed_future_ends_with_its_source_and_a_cancel_abandons_a_running_one():
    """``relay``: the result and the error of the source (mapped), and a cancel that ends the relay at once
    (``concurrent.futures.wait`` sees it) though the source still runs, and cancels the source too."""
    import concurrent.futures

    from runner.executors.base import relay

    source: concurrent.futures.Future = concurrent.futures.Future()
    done = relay(source)
    source.set_result(7)
    assert done.result(timeout=1) == 7

    source = concurrent.futures.Future()
    failed = relay(source, lambda e: RuntimeError(f"mapped {e}"))
    source.set_exception(ValueError("boom"))
    with pytest.raises(RuntimeError, match="mapped boom"):
        failed.result(timeout=1)

    source = concurrent.futures.Future()
    assert source.set_running_or_notify_cancel()  # running: it cannot be cancelled any more
    abandoned = relay(source)
    assert abandoned.cancel()
    ended, _ = concurrent.futures.wait([abandoned], timeout=1)
    assert ended == {abandoned} and not source.done()
    source.set_result(1)  # it ends later, unseen
    assert abandoned.cancelled()
