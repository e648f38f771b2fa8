"""``executor=local``: ``executor.workers`` checks at once on this machine, one thread each.

Threads suffice: a command check waits on its process, and ONNX Runtime releases the GIL while
it runs. Each running check may get its own GPU (``executor.gpus``) through ``CUDA_VISIBLE_DEVICES``.

With one worker (``executor.workers=1``) the search is the serial one, but the runner's thread builds the next
candidates (both outcomes' of a one-set round) while a check runs, so a candidate's conversion overlaps the
check before it: ONNX Runtime releases the GIL while it builds a session too. The Qwen2 export of
``benchmarks/README.md`` ("Building ahead with one worker"), 24 layers of width 64 on 2 cores: 39.5 s against
44.0 s serial, the same 47 checks and answer.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Callable, List, Optional, Sequence

from runner.candidates import Verdict
from runner.executors.base import Executor
from runner.executors.slot import Slot
from runner.executors.spread import Lane


class LocalExecutor(Executor):
    """A thread pool of ``workers`` threads (see ``Executor`` for the arguments and errors);
    ``workers`` defaults to the number of GPUs given, else this machine's cores."""

    name = "local"
    threaded = True

    def __init__(
        self,
        workers: Optional[int] = None,
        gpus: Optional[Sequence[Any]] = None,
        lookahead: bool = True,
    ):
        super().__init__(workers if workers is not None else (len(gpus or []) or os.cpu_count() or 1), gpus, lookahead)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="check")

    def _cancel_flag(self, iteration: int) -> threading.Event:
        """A ``threading.Event``."""
        return threading.Event()

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> concurrent.futures.Future[Verdict]:
        """Run ``fn(*args)`` on a pool thread (any: the slot carries the GPU)."""
        return self.pool.submit(fn, *args)

    def lanes(self) -> List[Lane]:
        """A thread per worker, each with its worker's GPU."""
        return [Lane(Slot(w, self.gpu(w))) for w in range(self.workers)]

    def close(self) -> None:
        """Wait for the pool's threads (their checks were cancelled or have ended)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
