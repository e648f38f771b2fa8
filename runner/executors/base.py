"""The executor interface and the check task every executor runs.

An executor runs ``run_check`` for each candidate of a round and reports the checks as they end;
the lifecycle (``statemachine/lifecycle.py``) owns rounds, sorting and the replay. Executors hand
out futures: ``concurrent.futures.Future`` on this machine, ``distributed.Future`` on a cluster.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import onnx

from runner.candidates import Candidate, Verdict
from runner.errors import ConfigError
from runner.executors.slot import CheckCancelled, Slot, set_current

#: ``spread(fn, shared, jobs) -> [fn(shared, job) for job in jobs]``, run where an executor can
Spread = Callable[[Callable[[Any, Any], Any], Any, Iterable[Any]], List[Any]]


def spread_here(fn: Callable[[Any, Any], Any], shared: Any, jobs: Iterable[Any]) -> List[Any]:
    """``[fn(shared, job) for job in jobs]`` in this thread, in order: ``Executor.spread`` without
    workers to spread over."""
    return [fn(shared, job) for job in jobs]


@dataclass(frozen=True)
class JobLanes:
    """Where work that is not a check runs, as an executor offers it (``Executor.job_lanes``):
    precision's ranking runs its nodes alone there.

    Attributes:
        spread: ``spread(fn, shared, jobs) -> [fn(shared, job) for job in jobs]`` (``Executor.spread``);
            default in this thread, in order.
        count: jobs ``spread`` runs at once at most (``Executor.lanes``).
    """

    spread: Spread = spread_here
    count: int = 1


#: jobs in this thread, one after another: where there is no executor
HERE = JobLanes()


@dataclass(frozen=True)
class Shipped:
    """A candidate's model, built before the check is sent elsewhere: the payload a check task calls."""

    model: onnx.ModelProto

    def __call__(self) -> onnx.ModelProto:
        return self.model


def shipped(candidate: Candidate, executor: str) -> Candidate:
    """``candidate`` with its model built here (a task elsewhere cannot call back into the strategy)
    and no writer: what a check in another process receives.

    Raises:
        ConfigError: the candidate is built in its check (TensorRT engines), on this machine only.
    """
    if candidate.write_in_check:
        raise ConfigError(
            "this mode's candidates are built in the check (TensorRT engines) on this machine; "
            f"use executor=local executor.gpus=[...] instead of {executor}"
        )
    payload = Shipped(candidate.payload()) if candidate.payload is not None else None
    return dataclasses.replace(candidate, write=None, payload=payload)


class Jobs:
    """``enumerate(jobs)`` that several threads take from, each job once; ``close`` ends it early.

    Args:
        jobs: any iterable (a generator builds each job when a lane takes it, so only the jobs
            in flight are held).
    """

    def __init__(self, jobs: Iterable[Any]):
        self._jobs = enumerate(jobs)
        self._lock = threading.Lock()
        self._closed = False
        #: jobs taken so far
        self.taken = 0
        #: what building a job raised (the jobs end there), or None
        self.error: Optional[BaseException] = None

    def take(self) -> Optional[Tuple[int, Any]]:
        """The next ``(index, job)``, or None once every job was taken or ``close`` was called.

        Raises:
            Whatever building the job raises (it is built under the lock, in the taking thread).
        """
        with self._lock:
            if self._closed:
                return None
            try:
                item = next(self._jobs, None)
            except BaseException as e:  # no job after it: every taker stops, and ``error`` says why
                self._closed, self.error = True, e
                raise
            if item is None:
                self._closed = True
            else:
                self.taken += 1
            return item

    @property
    def exhausted(self) -> bool:
        """True once no job is left to take."""
        return self._closed

    def close(self) -> None:
        """Hand out no more jobs."""
        with self._lock:
            self._closed = True


def run_on_threads(fn: Callable[[Any, Any], Any], shared: Any, source: Jobs, slots: Sequence[Slot]) -> Dict[int, Any]:
    """Take ``source``'s jobs on one thread per slot, each thread with its slot as the current one
    (its GPU), until none is left: ``{job index: fn(shared, job)}``. The first error stops every
    thread from taking more, and is raised once the others end their jobs (Ctrl-C likewise)."""
    results: Dict[int, Any] = {}

    def lane(slot: Slot) -> None:
        set_current(slot)
        try:
            while (item := source.take()) is not None:
                results[item[0]] = fn(shared, item[1])
        except BaseException:
            source.close()
            raise
        finally:
            set_current(None)

    with concurrent.futures.ThreadPoolExecutor(len(slots), thread_name_prefix="spread") as lanes:
        futures = [lanes.submit(lane, slot) for slot in slots]
        try:
            for future in futures:
                future.result()
        finally:
            source.close()  # the lanes end with the jobs they hold
    return results


def run_check(checker: Any, artifact: Path, iteration: int, candidate: Candidate, slot: Slot) -> Verdict:
    """The task of one check: write the artifact when the candidate writes it in its check (a
    TensorRT build), then ``checker.check`` it, with ``slot`` as this thread's current slot.

    Args:
        checker: a ``runner.checkers.base.Checker``.
        artifact: the slot's iteration artifact path.
        iteration: the 1-based iteration number.
        candidate: the candidate (``payload`` already built when the check runs elsewhere).
        slot: the check's slot (worker, GPU, cancel flag).

    Returns:
        The verdict, with ``check_s``: the seconds ``checker.check`` took where it ran
        (the lifecycle adds ``verdict_s``: the seconds from handing the check over to its verdict).

    Raises:
        CheckCancelled: the slot was cancelled before or during the check.
        Whatever the checker raises (a RunnerError stops the run).
    """
    set_current(slot)
    try:
        if slot.cancelled():
            raise CheckCancelled(f"iteration {iteration}")
        if candidate.write_in_check and candidate.write is not None:
            Path(artifact).parent.mkdir(parents=True, exist_ok=True)
            candidate.write(Path(artifact))
        start = time.perf_counter()
        verdict: Verdict = checker.check(artifact, iteration, candidate, slot=slot)
        verdict.check_s = round(time.perf_counter() - start, 4)
        return verdict
    finally:
        set_current(None)


class Executor(abc.ABC):
    """Runs checks: ``workers`` at once.

    Args:
        workers: checks at once (>= 1).
        gpus: GPU ids; each running check gets one (``CUDA_VISIBLE_DEVICES``), so ``workers``
            may not exceed their number. Empty: checks see every GPU.
        lookahead: while a round's checks run elsewhere, the runner builds the candidates the next
            round may hold (``Strategy.lookahead``); off for checks that need this machine's CPU.

    Attributes:
        name: the executor's name for the summary ("serial", "local", "dask").

    Raises:
        ConfigError: ``workers`` < 1, or more workers than GPUs.
    """

    name = ""
    #: seconds between looks at a cancel flag while a command check runs
    poll_s = 0.1

    def __init__(self, workers: int = 1, gpus: Optional[Sequence[Any]] = None, lookahead: bool = False):
        self.gpus: List[str] = [str(g) for g in (gpus or [])]
        self.lookahead = bool(lookahead)
        if int(workers) < 1:
            raise ConfigError(f"executor.workers={workers} must be 1 or more checks at once")
        if self.gpus and int(workers) > len(self.gpus):
            raise ConfigError(
                f"executor.workers={workers} with {len(self.gpus)} GPUs (executor.gpus): each running check gets "
                f"one GPU; set executor.workers={len(self.gpus)} or fewer, or list more GPUs"
            )
        self.workers = int(workers)

    def slot(self, worker: int, iteration: int) -> Slot:
        """The slot of the check of ``iteration`` on worker ``worker`` (0-based)."""
        gpu = self.gpus[worker] if self.gpus else None
        return Slot(worker, gpu, self.cancel_flag(iteration), self.poll_s)

    def thread_slots(self) -> List[Slot]:
        """One slot per worker, each on its GPU as this process numbers them, for threads of this
        process (no cancel flag): the lanes of ``spread`` run here."""
        return [Slot(w, self.gpus[w] if self.gpus else None) for w in range(self.workers)]

    def cancel_flag(self, iteration: int) -> Any:
        """A fresh flag that cancels one check (None: checks are not cancelled this way)."""
        return None

    def share(self, obj: Any) -> Any:
        """What to pass to ``submit`` for an object every check uses (the checker); itself here."""
        return obj

    def ship(self, candidate: Candidate) -> Candidate:
        """The candidate as a check task receives it (here: itself)."""
        return candidate

    @abc.abstractmethod
    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> Any:
        """Start ``fn(*args)`` for the check of slot ``worker`` (0-based); return its future."""

    def wait(self, futures: Iterable[Any], timeout_s: float) -> Tuple[Set[Any], Set[Any]]:
        """Wait up to ``timeout_s`` seconds for the first of ``futures`` to end: ``(done, not_done)``."""
        done, not_done = concurrent.futures.wait(
            list(futures), timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED
        )
        return set(done), set(not_done)

    def result(self, future: Any, iteration: int) -> Verdict:
        """The verdict of a finished check of ``iteration``; raises what the check raised."""
        return future.result()

    def cancel(self, future: Any) -> None:
        """Drop a future that has not started (a started check stops by its cancel flag)."""
        future.cancel()

    @property
    def lanes(self) -> int:
        """Jobs ``spread`` runs at once at most (1: one after another, here)."""
        return 1

    def job_lanes(self) -> JobLanes:
        """This executor's ``spread`` and ``lanes``, as work that is not a check takes them."""
        return JobLanes(self.spread, self.lanes)

    def spread(self, fn: Callable[[Any, Any], Any], shared: Any, jobs: Iterable[Any]) -> List[Any]:
        """``[fn(shared, job) for job in jobs]``: work that is not a check (precision's ranking runs
        each node alone on the checker's backend) spread over this executor's workers where it can;
        here, in this thread and in order (``spread_here``).

        Args:
            fn: a module-level function (it may be sent to a worker process); what it returns must
                pickle. Called with the current slot (``runner.executors.slot.current``) of the
                lane that runs it: its GPU is the lane's.
            shared: the object every call gets (a backend), sent once to each worker.
            jobs: the jobs, built as lanes take them.

        Returns:
            One result per job, in the jobs' order.

        Raises:
            Whatever ``fn`` raises (in this process; a job that fails elsewhere is run again here).
        """
        return spread_here(fn, shared, jobs)

    def facts(self, started: float) -> Dict[str, Any]:
        """This executor's own fields for ``summary.json`` (none here).

        Args:
            started: the run's start, ``time.monotonic()`` seconds.
        """
        return {}

    def close(self) -> None:
        """Release threads or the cluster connection."""


def executor_classes() -> Dict[str, type]:
    """``{name: class}`` of every executor of the ``executor`` config group (``conf/executor/*.yaml``'s
    ``_target_``): the one place that lists them is the config group itself."""
    from hydra.utils import get_class

    from runner.config_keys import group_targets

    return {name: get_class(target) for name, target in group_targets("executor").items()}
