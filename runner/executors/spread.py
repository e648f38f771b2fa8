"""``spread``: jobs that are not checks (precision's ranking runs each node alone on the checker's
backend) run on the lanes an executor offers (``Executor.lanes``): a thread per lane, each taking
the next job when it is free, so a slow lane takes fewer.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from runner.executors.slot import Slot, set_current

#: ``fn(shared, job)``
Job = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Lane:
    """A thread of this process that runs jobs, with ``slot`` as its current slot (its GPU).

    Attributes:
        slot: the lane's slot (worker 0, no GPU by default).
        timed: called with each job's seconds (``executor=processes`` starts its workers on a dear one).
    """

    slot: Slot = field(default_factory=Slot)
    timed: Optional[Callable[[float], None]] = None


#: one lane in this thread's process, no GPU: where there is no executor
HERE: Sequence[Lane] = (Lane(),)


def spread(lanes: Sequence[Lane], fn: Job, shared: Any, jobs: Iterable[Any]) -> List[Any]:
    """``[fn(shared, job) for job in jobs]``, the jobs taken by one thread per lane (the caller's own
    thread when there is one lane).

    Args:
        lanes: the ``Lane``s (threads of this process, each with its slot).
        fn: ``fn(shared, job)``; called with the current slot of the lane that runs it
            (``runner.executors.slot.current``).
        shared: the object every call gets (a backend).
        jobs: the jobs, each built (under a lock) when a lane takes it, so only the jobs in flight are held.

    Returns:
        One result per job, in the jobs' order.

    Raises:
        Whatever ``fn`` or building a job raises, once every lane has ended its job in hand (the
        first error stops every lane from taking more; Ctrl-C is raised at once).
    """
    source, lock, ended = enumerate(jobs), threading.Lock(), threading.Event()
    results: Dict[int, Any] = {}
    errors: List[BaseException] = []

    def run(lane: Lane) -> None:
        previous = set_current(lane.slot)  # the caller's, when the lane runs in the caller's thread
        try:
            while True:
                with lock:
                    item = None if ended.is_set() else next(source, None)
                    if item is None:
                        ended.set()
                        return
                began = time.monotonic()
                results[item[0]] = fn(shared, item[1])
                if lane.timed is not None:
                    lane.timed(time.monotonic() - began)
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
