"""``executor=dask``: checks as tasks on an existing Dask distributed cluster (optional ``dask`` extra).

``executor.address=tcp://HOST:8786`` names the scheduler (``dask scheduler``, or dask-jobqueue's
SLURM/PBS clusters). The checker is scattered to every worker once; each check is one task
(``runner.executors.base.run_check``) and its future. In-process checks (``checker=compare``)
receive the candidate's model with the task. Command checks run on the worker, so the run
directory (the iteration artifacts, ``checks/``, ``artifacts.paths``) must be on a file system the
workers share. A cancelled check stops by a cluster-wide ``distributed.Event``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, Callable, Iterable, Optional, Sequence, Set, Tuple

from runner.candidates import Candidate, Verdict
from runner.errors import ConfigError, MissingExtraError, first_line
from runner.executors.base import Executor, shipped

log = logging.getLogger(__name__)


def import_distributed(option: str) -> Any:
    """The ``distributed`` module.

    Raises:
        MissingExtraError: it is not installed (the ``dask`` extra), naming ``option``.
    """
    try:
        import distributed
    except ImportError:
        raise MissingExtraError("distributed", "dask", option) from None
    return distributed


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
    poll_s = 1.0  # each look asks the scheduler

    def __init__(
        self,
        address: Optional[str] = None,
        workers: Optional[int] = None,
        gpus: Optional[Sequence[Any]] = None,
        timeout_s: float = 30.0,
        lookahead: bool = True,
    ):
        distributed = import_distributed("executor=dask")
        self._watched: Set[Any] = set()  # futures whose end sets _any_ended
        self._any_ended = threading.Event()
        if not address:
            raise ConfigError("executor=dask needs executor.address=tcp://HOST:8786 (the Dask scheduler's address)")
        try:
            client = distributed.Client(address, timeout=timeout_s, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise ConfigError(
                f"executor.address={address}: cannot reach a Dask scheduler ({first_line(e)[:200]}); "
                "start one (dask scheduler; dask worker ADDRESS) or fix the address"
            ) from None
        self._attach(distributed, client, workers, gpus, lookahead, f"Dask cluster at {address}")

    def _attach(
        self,
        distributed: Any,
        client: Any,
        workers: Optional[int],
        gpus: Optional[Sequence[Any]],
        lookahead: bool,
        what: str,
    ) -> None:
        """Take ``client`` (connected) as this executor's; ``workers`` defaults to the cluster's threads.

        Raises:
            ConfigError: the cluster has no workers (the client is closed), or as ``Executor``'s.
        """
        self.distributed = distributed
        self.client = client
        threads = sum(client.nthreads().values())
        if threads == 0:
            self.close()
            raise ConfigError(f"{what}: the Dask cluster has no workers; start some with dask worker")
        try:
            super().__init__(workers if workers is not None else threads, gpus, lookahead)
        except ConfigError:
            self.close()
            raise
        self.run_id = uuid.uuid4().hex[:12]
        log.info("%s: %d worker threads, %d checks at once", what, threads, self.workers)

    def cancel_flag(self, iteration: int) -> Any:
        """A ``distributed.Event`` named after this run and the iteration."""
        return self.distributed.Event(f"runner-{self.run_id}-cancel-{iteration}", client=self.client)

    def share(self, obj: Any) -> Any:
        """Scatter ``obj`` to every worker once; tasks receive it by reference."""
        return self.client.scatter(obj, broadcast=True, hash=False)

    def ship(self, candidate: Candidate) -> Candidate:
        """The candidate with its model built here (``base.shipped``)."""
        return shipped(candidate, "executor=dask")

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> Any:
        """Submit ``fn(*args)`` as a task (never cached: ``pure=False``) on any worker."""
        return self.client.submit(fn, *args, pure=False)

    def wait(self, futures: Iterable[Any], timeout_s: float) -> Tuple[Set[Any], Set[Any]]:
        """Wait up to ``timeout_s`` seconds for the first of ``futures`` to end: ``(done, not_done)``.
        Each future tells when it ends (``add_done_callback``, once per future), so a verdict is
        seen as it comes (``distributed.wait`` would need this client as the process's default)."""
        pending = set(futures)
        for future in pending - self._watched:
            self._watched.add(future)
            future.add_done_callback(self._ended)
        self._any_ended.clear()  # an end from here on sets it again
        done = {f for f in pending if f.done()}
        if not done and timeout_s > 0:
            self._any_ended.wait(timeout_s)
            done = {f for f in pending if f.done()}
        self._watched -= done
        return done, pending - done

    def _ended(self, future: Any) -> None:
        """A watched future ended (called in Dask's callback thread, or the check's)."""
        self._any_ended.set()

    def close(self) -> None:
        """Close the connection (the cluster keeps running)."""
        self.client.close()
