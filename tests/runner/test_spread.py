"""``spread`` on ``Executor.lanes``: jobs that are not checks (precision's ranking runs nodes alone) on the
executor's lanes: threads with their GPUs (``executor=local``; ``executor=processes`` before and after its
workers start, whose dear jobs start them)."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest

from runner.backends.onnxruntime import OnnxRuntimeBackend
from runner.executors.local import LocalExecutor
from runner.executors.slot import current
from runner.executors.spread import HERE, RunHere, held, spread
from runner.graph.load import load_model
from runner.layerwise.ranking import introduced_ranking
from runner.lowp.convert import float_nodes, prepare
from tests.helpers.models import CLASSIFIER


def _where(shared: int, job: int):
    """A job that takes a while: its result, the process and the GPU of the lane that ran it."""
    time.sleep(0.02)
    return job * shared, os.getpid(), current().device


def _slow(shared: int, job: int):
    """As ``_where``, ten times longer."""
    time.sleep(0.2)
    return job * shared, os.getpid(), current().device


def _fails_at(shared: int, job: int) -> int:
    if job == shared:
        raise ValueError(f"job {job}")
    time.sleep(0.01)
    return job


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_that_cannot_be_built_is_raised_and_each_job_runs_once(workers):
    ran = []

    def record(shared: int, job: int) -> int:
        ran.append(job)
        return job

    def jobs():
        yield from range(5)
        raise ValueError("cannot build job 5")

    executor = LocalExecutor(workers=workers)
    try:
        assert spread(executor.lanes(), record, 0, range(9)) == list(range(9))
        assert sorted(ran) == list(range(9)), "each job once"
        ran.clear()
        with pytest.raises(ValueError, match="job 5"):
            spread(executor.lanes(), record, 0, jobs())
    finally:
        executor.close()
    assert sorted(ran) == list(range(5))


def test_local_spread_keeps_the_jobs_order_and_runs_each_lane_on_its_gpu():
    executor = LocalExecutor(workers=2, gpus=["3", "5"])
    try:
        got = spread(executor.lanes(), _where, 10, range(16))
    finally:
        executor.close()
    assert len(executor.lanes()) == 2
    assert [g[0] for g in got] == [10 * i for i in range(16)]
    assert {g[2] for g in got} == {"3", "5"}, "each thread runs its jobs on its own slot's GPU"
    assert current().device is None, "the caller's slot is left as it was"


def test_local_spread_raises_the_first_error_and_takes_no_more_jobs():
    taken = []

    def jobs():
        for i in range(200):
            taken.append(i)
            yield i

    executor = LocalExecutor(workers=2)
    try:
        with pytest.raises(ValueError, match="job 3"):
            spread(executor.lanes(), _fails_at, 3, jobs())
    finally:
        executor.close()
    assert len(taken) < 20


@pytest.mark.slow
def test_dear_jobs_start_the_workers_and_cheap_ones_do_not(caplog, monkeypatch):
    """start=lazy: a spread of quick jobs runs here and starts nothing; a job here (after the first) that
    takes ``DEAR_S`` (shortened for the test) starts the workers; the jobs stay on the lanes here, one per slot."""
    from runner.executors import processes
    from runner.executors.processes import ProcessExecutor

    monkeypatch.setattr(processes, "DEAR_S", 0.15)
    executor = ProcessExecutor(workers=2)
    try:
        got = spread(executor.lanes(), _where, 1, iter(range(20)))
        assert [g[0] for g in got] == list(range(20)) and {g[1] for g in got} == {os.getpid()}
        assert executor.launched_at is None
        with caplog.at_level(logging.INFO, logger="runner.executors"):
            got = spread(executor.lanes(), _slow, 1, list(range(4)))
        assert executor.launched_at is not None
    finally:
        executor.close()
    assert len(executor.lanes()) == 2, "a thread per slot (local_start)"
    assert [g[0] for g in got] == list(range(4)) and {g[1] for g in got} == {os.getpid()}
    assert any("starting the 2 worker processes" in m for m in caplog.messages)


@pytest.mark.slow
def test_process_spread_runs_everything_here_when_the_workers_cannot_start():
    from runner.errors import ConfigError
    from runner.executors.processes import ProcessExecutor

    executor = ProcessExecutor(workers=1, timeout_s=0.001, start="now")
    try:
        got = spread(executor.lanes(), _where, 1, range(5))
        assert [g[0] for g in got] == list(range(5)) and {g[1] for g in got} == {os.getpid()}
        with pytest.raises(ConfigError, match="did not start"):
            executor.slot(0, 1)  # the first check still says why
    finally:
        executor.close()


def _ranking(lanes=HERE):
    model = prepare(load_model(CLASSIFIER), "float16")
    layers = float_nodes(model)
    feeds = [{"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)}]
    return introduced_ranking(model, layers, feeds, "float16", lanes=lanes)


@pytest.mark.slow
def test_a_ranking_spread_over_threads_is_the_serial_ranking():
    """The classifier's nodes, run alone in 2 * 3 models on 3 threads beside the whole model's run, rank as
    when run alone in one model after it."""
    executor = LocalExecutor(workers=3)
    try:
        spread = _ranking(executor.lanes())
    finally:
        executor.close()
    serial = _ranking()
    assert serial is not None and len(serial) > 20
    assert spread == serial


def test_a_target_the_backend_cannot_run_leaves_no_ranking():
    """The whole target run, the spread's first job, still ends the ranking when the backend cannot run it
    (bf16 on ONNX Runtime's CPU provider): precision then ranks by magnitude."""
    from runner.backends.base import make_backend

    model = prepare(load_model(CLASSIFIER), "bfloat16")
    feeds = [{"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)}]
    executor = LocalExecutor(workers=2)
    try:
        order = introduced_ranking(
            model, float_nodes(model), feeds, "bfloat16", make_backend("onnxruntime"), lanes=executor.lanes()
        )
    finally:
        executor.close()
    assert order is None


def _broken_jobs(after: int):
    yield from range(after)
    raise RuntimeError("job building failed")


def test_a_job_that_cannot_be_built_is_raised_not_dropped():
    """Building a job raises: the spread raises it, never returns the jobs before it as if they were all."""
    executor = LocalExecutor(workers=2)
    try:
        with pytest.raises(RuntimeError, match="job building failed"):
            spread(executor.lanes(), _fails_at, -1, _broken_jobs(5))
    finally:
        executor.close()


def test_a_spread_in_a_checks_thread_leaves_its_slot_as_it_was():
    """One lane runs in the caller's thread: the check's own slot (its GPU) is current again afterwards."""
    from runner.executors.slot import Slot, set_current

    set_current(Slot(3, "1"))
    try:
        got = spread(HERE, _where, 2, range(3))
        assert [g[0] for g in got] == [0, 2, 4] and {g[2] for g in got} == {None}, "the lane's own slot: no GPU"
        assert current().worker == 3 and current().device == "1"
    finally:
        set_current(None)


class _Counted(OnnxRuntimeBackend):
    """ONNX Runtime's backend, counting the sessions it builds."""

    def __init__(self, **options):
        super().__init__(**options)
        self.built = 0

    def session(self, model, key):
        with self._lock:
            new = key not in self._sessions  # no GPU here: the key is the cache's own
        self.built += new
        return super().session(model, key)


@pytest.mark.slow
def test_a_ranking_on_many_lanes_builds_each_jobs_session_once():
    """Three lanes split the nodes alone into 6 models, run beside the whole model on each of 3 samples:
    7 sessions, built on the first sample and held for the others (a cache of 4 built 20)."""
    model = prepare(load_model(CLASSIFIER), "float16")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)} for _ in range(3)]
    backend = _Counted(cpu_arena=False)
    executor = LocalExecutor(workers=3)
    try:
        order = introduced_ranking(model, float_nodes(model), feeds, "float16", backend, lanes=executor.lanes())
    finally:
        executor.close()
    assert order is not None
    assert backend.built == 7


def _held_here(shared, job):
    """Whether this process holds anything sent once, and the job's value: for the let-go test."""
    from runner.executors.worker import _HELD

    return len(_HELD)


def _needs_runner(shared: int, job: int):
    """A job only the runner runs (as a model in the runner's weight file): ``RunHere`` in a worker."""
    if os.getpid() != shared:
        raise RunHere("not the runner")
    return job, os.getpid()


@pytest.mark.slow
def test_held_jobs_run_in_the_ready_workers_on_their_gpus_and_are_let_go_after():
    """Once every worker is ready, the lanes hand held jobs to their workers (each pinned: its device is
    "0"); a plain object's jobs stay here; after the block no worker holds the object; a job that must
    run in the runner (``RunHere``) runs here."""
    from runner.executors.processes import ProcessExecutor

    executor = ProcessExecutor(gpus=["0", "1"], start="now")
    try:
        assert executor.ready(60)
        lanes = executor.lanes()
        with held(lanes, 3) as shared:
            got = spread(lanes, _where, shared, range(12))
            again = spread(lanes, _held_here, shared, range(4))
        assert [g[0] for g in got] == [3 * i for i in range(12)]
        assert os.getpid() not in {g[1] for g in got} and len({g[1] for g in got}) == 2, "both workers, not here"
        assert {g[2] for g in got} == {"0"}, "each worker sees only its own GPU"
        assert set(again) == {1}, "the object is sent once and held by each worker during the block"
        with held(lanes, None) as nothing:
            assert set(spread(lanes, _held_here, nothing, range(4))) == {1}, "the first object was let go"
        plain = spread(lanes, _where, 3, range(4))
        assert {g[1] for g in plain} == {os.getpid()}, "a plain object's jobs run here"
        with held(lanes, os.getpid()) as runner_pid:
            assert spread(lanes, _needs_runner, runner_pid, range(3)) == [(i, os.getpid()) for i in range(3)]
    finally:
        executor.close()
