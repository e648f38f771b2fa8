"""Jobs that are not checks, spread over ``executor=processes``'s worker processes once they are ready.

``ProcessExecutor.spread`` runs jobs in the runner, on a thread per slot, and, as soon as the
workers are ready, hands jobs to each worker process as well (``WorkerLanes``, from a thread of its own):
work that comes before the first check (precision's ranking runs some 330 nodes alone on the
checker's backend) gains from the workers without waiting for them, and never runs slower than
it does here alone by more than the hand-over. A job a worker fails (its process died, or ``fn``
raised there) is run again here, so what ``fn`` raises is raised in the runner.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from runner.executors.base import Jobs, run_on_threads
from runner.executors.slot import Slot, set_current

log = logging.getLogger(__name__)


def run_pinned(fn: Callable[[Any, Any], Any], shared: Any, job: Any, slot: Slot) -> Any:
    """The task a worker runs for one job: ``fn(shared, job)`` with ``slot`` as the thread's slot
    (its GPU, numbered as the pinned worker sees it)."""
    set_current(slot)
    try:
        return fn(shared, job)
    finally:
        set_current(None)


class WorkerLanes:
    """Hands ``source``'s jobs to worker processes, one at a time per lane, from a thread of its
    own, from the moment ``connect`` gives a client until ``source`` runs dry.

    Args:
        connect: ``connect(timeout_s)`` -> the cluster's client once the workers are ready, None
            while they start (after waiting up to ``timeout_s`` seconds), False when they never will
            (they failed to start, or the executor closes).
        distributed: a callable returning Dask's ``distributed`` module (imported once ready).
        lanes: ``(worker name, slot)`` pairs: each is one job at a time on that worker.
        fn, shared: as ``Executor.spread``'s; ``shared`` is scattered to every worker once.
        source: the jobs, shared with the runner's own lane.

    Attributes:
        results: ``{job index: result}`` of the jobs the workers ran.
        failed: ``(index, job)`` of the jobs a worker took and did not finish (to run here).
    """

    #: seconds between looks at the workers' readiness and at a stop
    poll_s = 0.05

    def __init__(
        self,
        connect: Callable[[float], Any],
        distributed: Callable[[], Any],
        lanes: Sequence[Tuple[str, Slot]],
        fn: Callable[[Any, Any], Any],
        shared: Any,
        source: Jobs,
    ):
        self.connect, self.distributed, self.lanes = connect, distributed, list(lanes)
        self.fn, self.shared, self.source = fn, shared, source
        self.results: Dict[int, Any] = {}
        self.failed: List[Tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spread-to-workers", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait until the jobs the workers hold have ended (``source`` has run dry)."""
        self._thread.join()

    def stop(self) -> None:
        """Cancel the jobs the workers hold and end the thread (the runner stops: an error, Ctrl-C)."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        client = None
        while client is None:
            if self._stop.is_set() or self.source.exhausted:
                return
            client = self.connect(self.poll_s)
        if client is False:
            return
        running: Dict[Any, Tuple[Tuple[int, Any], str, Slot]] = {}
        try:
            self._hand_out(client, running)
        except Exception as e:  # the connection ended (the run closes): the runner's lane does the rest
            log.debug("Jobs stopped going to the workers: %s", e)
        finally:
            for future, (item, _, _) in running.items():
                future.cancel()
                self.failed.append(item)

    def _hand_out(self, client: Any, running: Dict[Any, Tuple[Tuple[int, Any], str, Slot]]) -> None:
        """Keep every lane busy with a job until ``source`` runs dry and the last job has ended."""
        ended: queue.Queue = queue.Queue()
        shared = client.scatter(self.shared, broadcast=True, hash=False)
        free = list(self.lanes)
        while True:
            while free and not self._stop.is_set():
                item = self.source.take()
                if item is None:
                    break
                name, slot = free.pop(0)
                try:
                    job = client.scatter([item[1]], workers=[name], direct=True, hash=False)[0]
                    future = client.submit(
                        run_pinned, self.fn, shared, job, slot, pure=False, workers=[name], allow_other_workers=False
                    )
                except Exception:
                    self.failed.append(item)  # taken but not handed out: it runs here
                    raise
                running[future] = (item, name, slot)
                future.add_done_callback(ended.put)
            if not running or self._stop.is_set():
                return
            try:
                future = ended.get(timeout=self.poll_s)
            except queue.Empty:
                continue
            item, name, slot = running.pop(future)
            try:
                self.results[item[0]] = client.gather(future, direct=True)
            except Exception as e:
                self.failed.append(item)
                if isinstance(e, self.distributed().KilledWorker):
                    log.warning("Worker %s died running a job; its jobs run in the runner", name)
                    continue  # that worker takes no more
                log.debug("A job failed on worker %s (%s); it runs again in the runner", name, e)
            free.append((name, slot))


def worker_lanes(names: Sequence[str], threads: int, gpus: Sequence[str], poll_s: float) -> List[Tuple[str, Slot]]:
    """``(worker name, slot)`` of each check slot of ``executor=processes``'s workers: slot ``i``
    on worker ``i // threads``, pinned to its GPU (``gpus[i]``) when there are GPUs."""
    return [
        (name, Slot(i, gpus[i] if gpus else None, None, poll_s, pinned=bool(gpus)))
        for w, name in enumerate(names)
        for i in range(w * threads, (w + 1) * threads)
    ]


def spread_with_workers(
    fn: Callable[[Any, Any], Any],
    shared: Any,
    jobs: Any,
    connect: Callable[[float], Any],
    distributed: Callable[[], Any],
    lanes: Sequence[Tuple[str, Slot]],
    here: Sequence[Slot],
    fn_here: Optional[Callable[[Any, Any], Any]] = None,
) -> Tuple[List[Any], int]:
    """``[fn(shared, job) for job in jobs]``, run here on a thread per slot of ``here`` (each on
    its GPU) and, once ``connect`` gives a client, on the workers' ``lanes`` as well
    (``WorkerLanes``); jobs a worker did not finish run here after the rest. ``fn_here``, where
    given, runs the jobs of ``here``'s threads in ``fn``'s stead (``fn`` with a timer).

    Returns:
        ``(results in the jobs' order, how many ran on the workers)``.

    Raises:
        Whatever ``fn`` raises here, or building a job raised in either place (the lanes are
        stopped first).
    """
    source = Jobs(jobs)
    workers = WorkerLanes(connect, distributed, lanes, fn, shared, source)
    try:
        results = run_on_threads(fn_here or fn, shared, source, here)
        workers.join()
        if source.error is not None:  # raised in the workers' thread: no job after it was built
            raise source.error
        for index, job in workers.failed:
            results[index] = fn(shared, job)
    finally:
        source.close()
        workers.stop()
    elsewhere = {i: r for i, r in workers.results.items() if i not in results}
    results.update(elsewhere)
    return [results[i] for i in range(source.taken)], len(elsewhere)
