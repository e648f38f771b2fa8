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

    def close(self) -> None:
        """Hand out no more jobs."""
        with self._lock:
            self._closed = True


class Lane:
    """A thread of this process that runs jobs, with ``slot`` as its current slot (its GPU).

    Args:
        slot: the lane's slot (worker 0, no GPU by default).
        timed: called with each job's seconds (``executor=processes`` starts its workers on a dear one).
    """

    def __init__(self, slot: Optional[Slot] = None, timed: Optional[Callable[[float], None]] = None):
        self.slot, self.timed = slot or Slot(), timed

    def run(self, fn: Job, shared: Any, source: Jobs, results: Dict[int, Any]) -> None:
        """Take ``source``'s jobs until none is left, putting ``fn(shared, job)`` in ``results`` by index.

        Raises:
            Whatever ``fn`` raises (``source`` is closed first, so the other lanes stop taking).
        """
        previous = set_current(self.slot)  # the caller's, when the lane runs in the caller's thread
        try:
            while (item := source.take()) is not None:
                began = time.monotonic()
                results[item[0]] = fn(shared, item[1])
                if self.timed is not None:
                    self.timed(time.monotonic() - began)
        except BaseException:
            source.close()
            raise
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
        jobs: the jobs, built as lanes take them.

    Returns:
        One result per job, in the jobs' order.

    Raises:
        Whatever ``fn`` or building a job raises, once every lane has ended its job in hand (the
        first error stops every lane from taking more; Ctrl-C is raised at once).
    """
    source = Jobs(jobs)
    results: Dict[int, Any] = {}
    if len(lanes) == 1:  # no thread needed
        lanes[0].run(fn, shared, source, results)
    else:
        errors: List[BaseException] = []

        def run(lane: Lane) -> None:
            try:
                lane.run(fn, shared, source, results)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(lane,), name="spread", daemon=True) for lane in lanes]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        finally:
            source.close()  # Ctrl-C: the lanes end with the jobs they hold
        if source.error is not None:
            raise source.error
        if errors:
            raise errors[0]
    return [results[i] for i in range(source.taken)]
