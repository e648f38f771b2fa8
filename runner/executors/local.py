"""``executor=local``: ``executor.workers`` checks at once on this machine, one thread each.

Threads suffice: a command check waits on its process, and ONNX Runtime releases the GIL while
it runs. Each running check may get its own GPU (``executor.gpus``) through ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable, Iterable, List, Optional, Sequence

from runner.candidates import Verdict
from runner.executors.base import Executor, Jobs, run_on_threads


class LocalExecutor(Executor):
    """A thread pool of ``workers`` threads (see ``Executor`` for the arguments and errors);
    ``workers`` defaults to the number of GPUs given, else this machine's cores."""

    name = "local"

    def __init__(
        self,
        workers: Optional[int] = None,
        gpus: Optional[Sequence[Any]] = None,
        lookahead: bool = True,
    ):
        super().__init__(workers if workers is not None else (len(gpus or []) or os.cpu_count() or 1), gpus, lookahead)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="check")

    def cancel_flag(self, iteration: int) -> threading.Event:
        """A ``threading.Event``."""
        return threading.Event()

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> concurrent.futures.Future:
        """Run ``fn(*args)`` on a pool thread (any: the slot carries the GPU)."""
        return self.pool.submit(fn, *args)

    @property
    def lanes(self) -> int:
        """``workers``: one thread each."""
        return self.workers

    def spread(self, fn: Callable[[Any, Any], Any], shared: Any, jobs: Iterable[Any]) -> List[Any]:
        """As ``Executor.spread``: ``workers`` threads take jobs, each with the slot of its worker
        (its GPU); the first error stops every thread from taking more, and is raised."""
        source = Jobs(jobs)
        results = run_on_threads(fn, shared, source, self.thread_slots())
        return [results[i] for i in range(source.taken)]

    def close(self) -> None:
        """Wait for the pool's threads (their checks were cancelled or have ended)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
