"""``executor=dask``: checks as tasks on an existing Dask distributed cluster (optional ``dask`` extra).

``executor.address=tcp://HOST:8786`` names the scheduler (``dask scheduler``, or dask-jobqueue's
SLURM/PBS clusters). The checker is scattered to every worker once; each check is one task
(``runner.executors.base.run_check``) and its future. In-process checks (``checker=compare``)
receive the candidate's model with the task. Command checks run on the worker, so the run
directory (the iteration artifacts, ``checks/``, ``artifacts.paths``) must be on a file system the
workers share. A cancelled check stops by a cluster-wide ``distributed.Event``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import uuid
from typing import Any, Callable, Optional, Sequence

from runner.candidates import Verdict
from runner.errors import ConfigError, MissingExtraError, first_line
from runner.executors.base import Executor, Shared, relay

log = logging.getLogger(__name__)


class DaskExecutor(Executor):
    """Connects to the scheduler at ``address``; ``workers`` checks at once (default: every worker
    thread of the cluster).

    Args:
        address: the scheduler's address, e.g. ``tcp://10.0.0.5:8786``.
        workers: checks at once; None: the cluster's worker threads when connecting.
        gpus: as ``Executor``'s (the workers' own GPU ids).
        timeout_s: seconds to wait for the scheduler.
        lookahead: as ``Executor``'s.

    Raises:
        MissingExtraError: ``distributed`` is not installed (the ``dask`` extra).
        ConfigError: no address, the scheduler cannot be reached, or the cluster has no workers.
    """

    name = "dask"
    elsewhere = True
    poll_s = 1.0  # each look asks the scheduler

    def __init__(
        self,
        address: Optional[str] = None,
        workers: Optional[int] = None,
        gpus: Optional[Sequence[Any]] = None,
        timeout_s: float = 30.0,
        lookahead: bool = True,
    ):
        try:
            import distributed
        except ImportError:
            raise MissingExtraError("distributed", "dask", "executor=dask") from None
        if not address:
            raise ConfigError("executor=dask needs executor.address=tcp://HOST:8786 (the Dask scheduler's address)")
        try:
            client = distributed.Client(address, timeout=timeout_s, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise ConfigError(
                f"executor.address={address}: cannot reach a Dask scheduler ({first_line(e)[:200]}); "
                "start one (dask scheduler; dask worker ADDRESS) or fix the address"
            ) from None
        self.distributed, self.client = distributed, client
        threads = sum(client.nthreads().values())
        try:
            if threads == 0:
                raise ConfigError(f"the Dask cluster at {address} has no workers; start some with dask worker")
            super().__init__(workers if workers is not None else threads, gpus, lookahead)
        except ConfigError:
            self.close()
            raise
        self.run_id = uuid.uuid4().hex[:12]
        log.info("Dask cluster at %s: %d worker threads, %d checks at once", address, threads, self.workers)

    def _cancel_flag(self, iteration: int) -> Any:
        """A ``distributed.Event`` named after this run and the iteration."""
        return self.distributed.Event(f"runner-{self.run_id}-cancel-{iteration}", client=self.client)

    def share(self, obj: Shared) -> Any:
        """Scatter ``obj`` to every worker once; tasks receive it by reference."""
        return self.client.scatter(obj, broadcast=True, hash=False)

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> concurrent.futures.Future[Verdict]:
        """Submit ``fn(*args)`` as a task (never cached: ``pure=False``) on any worker; its future relayed."""
        return relay(self.client.submit(fn, *args, pure=False))

    def close(self) -> None:
        """Close the connection (the cluster keeps running)."""
        self.client.close()
