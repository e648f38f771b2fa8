"""``spread``: jobs that are not checks (precision's ranking runs each node alone on the checker's
backend) run on the lanes an executor offers (``Executor.lanes``): a thread per lane, each taking
the next job when it is free, so a slow lane takes fewer.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from runner.executors.slot import Slot, set_current

#: ``fn(shared, job)``
Job = Callable[[Any, Any], Any]
#: the next ``(index, job)``, or None once there is none
Take = Callable[[], Optional[Tuple[int, Any]]]


class Lane:
    """A thread of this process that runs jobs, with ``slot`` as its current slot (its GPU).

    Args:
        slot: the lane's slot (worker 0, no GPU by default).
        timed: called with each job's seconds (``executor=processes`` starts its workers on a dear one).
    """

    def __init__(self, slot: Optional[Slot] = None, timed: Optional[Callable[[float], None]] = None):
        self.slot, self.timed = slot or Slot(), timed

    def run(self, fn: Job, shared: Any, take: Take, results: Dict[int, Any]) -> None:
        """Run ``fn(shared, job)`` for each job ``take`` gives until it gives None, putting the results in
        ``results`` by index.

        Raises:
            Whatever ``fn`` or ``take`` raises.
        """
        previous = set_current(self.slot)  # the caller's, when the lane runs in the caller's thread
        try:
            while (item := take()) is not None:
                began = time.monotonic()
                results[item[0]] = fn(shared, item[1])
                if self.timed is not None:
                    self.timed(time.monotonic() - began)
        finally:
            set_current(previous)


#: one lane in this thread's process, no GPU: where there is no executor
HERE: Sequence[Lane] = (Lane(),)


def spread(lanes: Sequence[Lane], fn: Job, shared: Any, jobs: Iterable[Any]) -> List[Any]:
    """``[fn(shared, job) for job in jobs]``, the jobs taken by one thread per lane.

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

    def take() -> Optional[Tuple[int, Any]]:
        with lock:
            item = None if ended.is_set() else next(source, None)
            if item is None:
                ended.set()
            return item

    def run(lane: Lane) -> None:
        try:
            lane.run(fn, shared, take, results)
        except BaseException as e:
            ended.set()  # the other lanes take no more
            errors.append(e)

    if len(lanes) == 1:  # no thread needed
        lanes[0].run(fn, shared, take, results)
        return [results[i] for i in range(len(results))]
    threads = [threading.Thread(target=run, args=(lane,), name="spread", daemon=True) for lane in lanes]
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
