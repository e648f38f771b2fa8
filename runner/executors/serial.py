"""``executor=serial``: one check at a time in the runner's own thread (the default)."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Optional

from runner.candidates import Verdict
from runner.errors import ConfigError
from runner.executors.base import Executor


class SerialExecutor(Executor):
    """Runs each check when it is submitted, in the calling thread: Ctrl-C interrupts the check
    itself, and whatever the check raises propagates from ``submit``.

    Raises:
        ConfigError: ``workers`` other than 1 (several checks at once need ``executor=local``).
    """

    name = "serial"

    def __init__(self, workers: Optional[int] = None):
        if workers not in (None, 1):
            raise ConfigError(f"executor.workers={workers} runs checks at once: add executor=local (or executor=dask)")
        super().__init__(1)

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> concurrent.futures.Future[Verdict]:
        """Run ``fn(*args)`` now; return a finished future holding its verdict."""
        future: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
        future.set_result(fn(*args))
        return future
