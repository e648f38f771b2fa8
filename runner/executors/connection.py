"""The runner's connection to ``executor=processes``'s worker processes: start, connect, stop.

``WorkerConnection`` starts the cluster's process (``runner.executors.cluster_process``) from a
thread of its own once the hand-over launches the workers (``runner.executors.handover``: at once,
or once the work left pays for them), and waits for the scheduler's address it prints once every
worker has started. It connects only once the hand-over wants the workers: then it imports Dask,
connects a ``Client`` and warms the workers' GPUs (``runner.executors.cluster.warm_cuda``). An
error there is kept for ``client`` to raise in the runner's thread; a close that comes meanwhile
ends it all.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Dict, Optional

from runner.errors import ConfigError
from runner.executors.cluster import warm_cuda
from runner.executors.cluster_process import ClusterProcess
from runner.executors.dask import import_distributed
from runner.executors.handover import HandOver

log = logging.getLogger(__name__)


class WorkerConnection:
    """Starts the workers when they are launched and connects to them when they are wanted.

    Args:
        spec: the cluster's SPEC (``runner.executors.cluster``: ``names``, ``env``, ``nthreads``,
            ``timeout_s``, ``log``).
        handover: decides when the workers start (``launch``) and when the ready ones are
            wanted.

    Attributes:
        distributed: Dask's ``distributed`` module, once imported (None before).
        address: set once every worker has started (they can be connected).
        ready: set once the start has ended: connected, failed, or closed.
        failed: what the start raised, until ``client`` raises it.
        closing: set by ``close``.
        launched_at: when the workers were launched (``time.monotonic()``), None before.
    """

    def __init__(self, spec: Dict[str, Any], handover: HandOver):
        self.count, self.timeout_s, self.handover = len(spec["names"]), float(spec["timeout_s"]), handover
        self.distributed: Any = None
        self.address = threading.Event()
        self.ready = threading.Event()
        self.failed: Optional[BaseException] = None
        self.closing = False
        self._client: Any = None
        self._lock = threading.Lock()  # the start thread publishes the client under it
        self.launched_at: Optional[float] = None
        self._cluster = ClusterProcess(spec)
        self._thread = threading.Thread(target=self._start, name="start-workers", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        """Once the workers are launched, start the cluster's process, wait for the scheduler's
        address it prints once every worker has started, wait until the workers are wanted, then
        import Dask, connect and warm their GPUs (in the background thread; an error is kept for
        ``client``)."""
        began = 0.0
        try:
            while not self.handover.launch.wait(0.05):
                if self.closing:
                    return
            self.launched_at = began = time.monotonic()
            log.info("Starting %d worker processes", self.count)
            address = self._cluster.address(self.timeout_s)
            if address is None:  # closed meanwhile
                return
            self.address.set()
            self.handover.ready()
            while not self.handover.wanted.wait(0.05):
                if self.closing:
                    return
            log.debug("Workers ready after %.1f s at %s; connecting", time.monotonic() - began, address)
            distributed = import_distributed("executor=processes")
            if not log.isEnabledFor(logging.DEBUG):  # its import set Dask's own levels; verbose=true keeps them
                logging.getLogger("distributed").setLevel(logging.WARNING)
            self.distributed = distributed
            client = distributed.Client(address, set_as_default=False, timeout=max(self.timeout_s, 10.0))
            client.run(warm_cuda)  # the workers' GPUs, untouched until they are wanted
            with self._lock:
                if self.closing:
                    client.close()
                    return
                self._client = client
        except BaseException as e:  # raised in the runner's thread by the next use of the client
            self.failed = e
        finally:
            self.ready.set()
        if self.failed is None and not self.closing:
            log.info("%d worker processes ready after %.1f s", self.count, time.monotonic() - began)

    def client(self) -> Any:
        """The cluster's client: wants the workers and waits for the connection.

        Raises:
            ConfigError: the workers did not start (within ``timeout_s``, or at all); the
                connection is closed first.
        """
        self.handover.want()
        self._thread.join()
        if self.failed is not None:
            failed, self.failed = self.failed, None
            self.close()
            if isinstance(failed, TimeoutError) or str(failed).startswith("TimeoutError"):
                raise ConfigError(
                    f"executor=processes: {self.count} worker processes did not start within "
                    f"{self.timeout_s:g} s; "
                    "raise executor.timeout_s or start fewer (executor.workers, executor.per_gpu)"
                ) from None
            raise ConfigError(
                f"executor=processes: the worker processes could not start ({type(failed).__name__}: "
                f"{str(failed).splitlines()[0] if str(failed) else ''}); run with verbose=true for Dask's log"
            ) from failed
        return self._client

    def connected(self, timeout_s: float) -> Any:
        """The client once connected (after waiting up to ``timeout_s`` seconds), None while the
        workers start or wait to be launched, False when it never will be (``runner.executors.lanes.WorkerLanes``'s
        ``connect``); ready workers are wanted, for the jobs still to run."""
        if self.address.is_set():
            self.handover.want()
        if not self.ready.wait(timeout_s):
            return None
        with self._lock:
            return self._client if self._client is not None and not self.closing else False

    def close(self) -> None:
        """Close the connection and stop every worker process with the cluster's process; during
        the start-up too, without waiting for it."""
        with self._lock:
            self.closing = True
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # a cluster already gone ends the connection with an error
                client.close(timeout=5)
        self._cluster.stop()
        self._thread.join()
