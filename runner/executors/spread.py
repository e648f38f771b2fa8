"""``spread``: jobs that are not checks (precision's ranking runs each node alone on the checker's
backend) run on the lanes an executor offers (``Executor.lanes``): a thread per lane, each taking
the next job when it is free, so a slow lane takes fewer.

A lane of ``executor=processes`` hands its jobs to its worker process once that is ready (``Remote``),
when the object they share was sent there (``held``): each process then runs its jobs with its own
sessions, where threads of one process slow each other (a CUDA session's first run, cuDNN's set-up of
each convolution: benchmarks/README.md, "On 2 GPUs").
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Protocol, Sequence

from runner.executors.slot import Slot, set_current
from runner.executors.worker import Held

#: ``fn(shared, job)``
Job = Callable[[Any, Any], Any]


class RunHere(Exception):
    """Raised by a job in a worker process that only the runner can run (a model whose weights are in
    the runner's weight file): the lane runs it here instead."""


class Remote(Protocol):
    """A worker process a lane hands its jobs to (``executor=processes``)."""

    def ready(self) -> bool:
        """True once the worker can take jobs (started and warmed)."""

    def call(self, fn: Job, shared: Held, job: Any) -> Any:
        """``fn(shared's object, job)`` in the worker, waited for; raises what it raises."""

    def drop(self, shared: Held) -> None:
        """Let go of ``shared`` in the worker (its sessions with it)."""


@dataclass(frozen=True)
class Lane:
    """A thread of this process that runs jobs, with ``slot`` as its current slot (its GPU), or hands
    them to ``remote`` once that is ready.

    Attributes:
        slot: the lane's slot (worker 0, no GPU by default).
        timed: called with the seconds of each job run here (``executor=processes`` starts its
            workers on a dear one).
        remote: the worker process that takes the lane's jobs once ready (when their shared object is
            ``held``); None: always here.
    """

    slot: Slot = field(default_factory=Slot)
    timed: Optional[Callable[[float], None]] = None
    remote: Optional[Remote] = None


@contextlib.contextmanager
def held(lanes: Sequence[Lane], obj: Any) -> Iterator[Any]:
    """``obj`` as jobs on ``lanes`` share it for the ``with`` block: a ``Held``, sent once to each worker
    process that takes a job (its sessions then serve every ``spread`` of the block) and let go there
    at the end; ``obj`` itself when no lane has a worker process.

    Example: ``with held(lanes, backend) as shared: spread(lanes, run_alone, shared, jobs)``.
    """
    remotes = [lane.remote for lane in lanes if lane.remote is not None]
    if not remotes:
        yield obj
        return
    shared = Held(obj)
    try:
        yield shared
    finally:
        for remote in remotes:
            remote.drop(shared)


#: one lane in this thread's process, no GPU: where there is no executor
HERE: Sequence[Lane] = (Lane(),)


def spread(lanes: Sequence[Lane], fn: Job, shared: Any, jobs: Iterable[Any]) -> List[Any]:
    """``[fn(shared, job) for job in jobs]``, the jobs taken by one thread per lane (the caller's own
    thread when there is one lane).

    Args:
        lanes: the ``Lane``s (threads of this process, each with its slot, perhaps its worker process); none:
            one lane in this thread (``HERE``).
        fn: ``fn(shared, job)``; called with the current slot of the lane that runs it
            (``runner.executors.slot.current``). A module-level function where ``shared`` is ``held``
            (it is pickled to the worker processes).
        shared: the object every call gets (a backend), or a ``Held`` one (``held``): then a lane whose
            worker process is ready runs its jobs there.
        jobs: the jobs, each built (under a lock) when a lane takes it, so only the jobs in flight are held.

    Returns:
        One result per job, in the jobs' order.

    Raises:
        Whatever ``fn`` or building a job raises, once every lane has ended its job in hand (the
        first error stops every lane from taking more; Ctrl-C is raised at once).
    """
    lanes = lanes or HERE
    source, lock, ended = enumerate(jobs), threading.Lock(), threading.Event()
    results: Dict[int, Any] = {}
    errors: List[BaseException] = []

    here = shared.obj if isinstance(shared, Held) else shared

    def run_one(lane: Lane, job: Any) -> Any:
        if lane.remote is not None and isinstance(shared, Held) and lane.remote.ready():
            try:
                return lane.remote.call(fn, shared, job)
            except RunHere:
                pass
        began = time.monotonic()
        result = fn(here, job)
        if lane.timed is not None:
            lane.timed(time.monotonic() - began)
        return result

    def run(lane: Lane) -> None:
        previous = set_current(lane.slot)  # the caller's, when the lane runs in the caller's thread
        try:
            while True:
                with lock:
                    item = None if ended.is_set() else next(source, None)
                    if item is None:
                        ended.set()
                        return
                results[item[0]] = run_one(lane, item[1])
        except BaseException as e:
            ended.set()  # the other lanes take no more
            errors.append(e)
        finally:
            set_current(previous)

    if len(lanes) == 1:  # no thread needed
        run(lanes[0])
    many = lanes if len(lanes) > 1 else ()
    threads = [threading.Thread(target=run, args=(lane,), name="spread", daemon=True) for lane in many]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:
        ended.set()  # Ctrl-C: the lanes end with the jobs they hold
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(results))]
