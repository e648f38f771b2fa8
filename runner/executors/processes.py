"""``executor=processes``: checks in worker processes on this machine, one (or ``per_gpu``) per GPU.

In-process checks (``checker=compare`` on ONNX Runtime's CUDA execution provider) spend their time
in Python: converting, serializing, building a session. Threads of one process share the
interpreter for that, so ``executor=local`` gains little from running them at once (2 threads on
an H100: 0.86 to 0.96x serial, benchmarks/README.md, "GPU checks"); worker processes do not share it, but each
pays its start-up and its first session of the model (seconds). Each worker is pinned to its
GPU (``CUDA_VISIBLE_DEVICES`` is set before it imports ONNX Runtime) and keeps the checker it
received once, with its golden values and cached sessions, between checks.

The engine is Dask distributed's own: a ``SpecCluster`` of ``Nanny`` processes
(``threads_per_worker`` threads each) in a process of its own (``runner.executors.cluster``),
driven through a ``Client`` exactly as ``executor=dask`` drives a cluster elsewhere; Dask is
imported here only once the workers are ready, so a run that ends sooner never pays for it. The
check of slot ``i`` always runs on worker ``i // threads_per_worker``, so its GPU and
``{worker}`` match. A worker process that dies in a check (a crash
in the backend) is not given the check again: the run stops with an error naming the iteration,
instead of a verdict the check never gave.

Starting the workers costs seconds (spawning, importing ONNX Runtime, a CUDA context each), and a
worker's first check of the model costs more again (the model's kernels load, its first session
allocates). With ``local_start`` (the default) the checks of the rounds that start before the
workers are ready run here, in threads as ``executor=local`` runs them, each on its slot's GPU;
with ``start="auto"`` (the default) the workers start only once the work left would take longer
here than their start-up (``runner.executors.handover``), so a run of cheap checks never starts them.
With a checker whose check can be repeated unseen (``Checker.repeatable``: the compare checker),
each worker then checks the first candidate checked here again, its verdict unused, while the
rounds go on here; once every worker has, every round goes to the workers. Ready workers are
connected (``runner.executors.connection``: Dask imported, their GPUs warmed) only when the checks left would take
longer here than that costs (``runner.executors.handover``), or when jobs of ``spread`` (precision's
ranking) or a check that must run on a worker want them.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import itertools
import logging
import threading
import time
import uuid
from typing import Any, Callable, Iterable, List, Optional, Sequence, Set, Sized

from runner.candidates import Candidate, Verdict
from runner.errors import CheckError, ConfigError, MissingExtraError
from runner.executors.base import Executor
from runner.executors.connection import WorkerConnection
from runner.executors.dask import DaskExecutor
from runner.executors.handover import HandOver
from runner.executors.lanes import spread_with_workers, worker_lanes
from runner.executors.local import LocalExecutor
from runner.executors.slot import Slot, visible_gpu

log = logging.getLogger(__name__)


class ProcessExecutor(DaskExecutor):
    """Starts ``workers`` worker processes (a Dask ``SpecCluster`` in a process of its own,
    ``runner.executors.cluster``, started from a background thread once ``start`` says) and
    runs ``threads_per_worker`` checks at a time on each; stops them when the run ends, on an
    error or on Ctrl-C. The executor's slots (``workers`` attribute) are the checks at once:
    processes times ``threads_per_worker``; slot ``i`` runs on process ``i // threads_per_worker``.

    Args:
        workers: worker processes; with ``gpus`` it must be ``len(gpus) * per_gpu`` (the default),
            without them the default is 2.
        gpus: GPU ids as this process numbers them; each gets ``per_gpu`` workers pinned to it.
        per_gpu: workers per GPU (>= 1): two let one worker convert and build its session while
            the other's model runs.
        lookahead: as ``Executor``'s.
        timeout_s: seconds the workers get to start and warm (their process group is stopped
            after that, and the next round's first check raises).
        local_start: run the checks of rounds that start before every worker is ready in this
            process (threads, one per slot, each on its slot's GPU) instead of waiting for them.
            False: every check runs in a worker process (a check that may crash its process).
        threads_per_worker: checks at once in each worker process (>= 1), in threads that share
            its CUDA context (two processes on one GPU time-slice it; on an H100 two threads paid
            for checks of 0.3 s and lost for checks of 3 s, benchmarks/README.md, "GPU checks").
        start: ``"auto"``: start the workers once the work left (checks, ``spread``'s jobs) would
            take longer here than their start-up and hand-over; ``"now"``: with the run. Without
            ``local_start`` they start at once.

    Raises:
        MissingExtraError: ``distributed`` is not installed (the ``dask`` extra).
        ConfigError: ``per_gpu`` or ``threads_per_worker`` < 1, ``workers`` disagreeing with
            ``gpus`` and ``per_gpu``, or ``start`` neither ``"auto"`` nor ``"now"``; from the
            first use of ``client`` (the round's first check), workers that did not start within
            ``timeout_s``.
    """

    name = "processes"

    def __init__(
        self,
        workers: Optional[int] = None,
        gpus: Optional[Sequence[Any]] = None,
        per_gpu: int = 1,
        lookahead: bool = True,
        timeout_s: float = 60.0,
        local_start: bool = True,
        threads_per_worker: int = 1,
        start: str = "auto",
    ):
        if importlib.util.find_spec("distributed") is None:  # imported by the start thread (a second or so)
            raise MissingExtraError("distributed", "dask", "executor=processes")
        if int(per_gpu) < 1:
            raise ConfigError(f"executor.per_gpu={per_gpu} must be 1 or more workers per GPU")
        if int(threads_per_worker) < 1:
            raise ConfigError(f"executor.threads_per_worker={threads_per_worker} must be 1 or more checks per worker")
        listed = [str(g) for g in (gpus or [])]
        pinned: List[Optional[str]] = [g for g in listed for _ in range(int(per_gpu))]
        if listed and workers is not None and int(workers) != len(pinned):
            raise ConfigError(
                f"executor.workers={workers} with {len(listed)} GPUs and executor.per_gpu={per_gpu}: "
                f"executor=processes starts {len(pinned)} workers; drop executor.workers or set executor.per_gpu"
            )
        count = len(pinned) if listed else int(workers if workers is not None else 2)
        if count < 1:
            raise ConfigError(f"executor.workers={workers} must be 1 or more worker processes")
        if not listed:
            pinned = [None] * count
        #: checks at once in each worker process (its threads share its CUDA context)
        self.threads = int(threads_per_worker)
        self.names = [f"check-{i}" for i in range(count)]
        self.env = [{"CUDA_VISIBLE_DEVICES": visible_gpu(gpu)} if gpu is not None else {} for gpu in pinned]
        self.timeout_s = float(timeout_s)
        self._watched: Set[Any] = set()  # futures whose end sets _any_ended (DaskExecutor.wait)
        self._any_ended = threading.Event()
        # slot i runs on worker process i // threads, on that process's GPU
        slot_gpus = [g for g in pinned if g is not None for _ in range(self.threads)]
        Executor.__init__(self, count * self.threads, slot_gpus, lookahead)
        self.run_id = uuid.uuid4().hex[:12]
        self.local_start = bool(local_start)
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None  # the checks run here at the start
        self._here: Set[int] = set()  # id() of the slots whose check runs here
        self._scattered: Any = None  # the shared checker as the workers hold it
        self._repeatable = False  # the shared checker may check a candidate again (warming the workers)
        self._warming: Optional[List[Any]] = None  # the workers' warm-up checks, once sent
        #: when to start the workers, and to connect to them once ready (the work left may end sooner here)
        self.handover = HandOver(count * self.threads, start=start)
        if not self.local_start:  # every check runs on a worker: they start at once
            self.handover.launch.set()
        #: checks run here before the workers were ready
        self.local_checks = 0
        self._handed_over = False
        #: the workers, started from a thread of its own once launched
        self.connection = WorkerConnection(
            {
                "names": self.names,
                "env": self.env,
                "nthreads": self.threads,
                "timeout_s": self.timeout_s,
                "log": log.isEnabledFor(logging.DEBUG),
            },
            self.handover,
        )
        where = f" on GPUs {listed}, {per_gpu} each" if listed else ""
        each = f", {self.threads} checks at once in each" if self.threads > 1 else ""
        when = "now" if self.handover.launch.is_set() else "once the work left pays for them (executor.start=auto)"
        log.info("%d worker processes%s%s: they start %s", count, where, each, when)

    @property
    def client(self) -> Any:
        """The cluster's client, once every worker has started (``WorkerConnection.client``).

        Raises:
            ConfigError: the workers did not start (within ``timeout_s``, or at all).
        """
        try:
            return self.connection.client()
        except ConfigError:
            self.close()
            raise

    @client.setter
    def client(self, value: Any) -> None:
        self.connection._client = value

    @property
    def launched_at(self) -> Optional[float]:
        """When the workers were started (``time.monotonic()``), None while they are not."""
        return self.connection.launched_at

    @property
    def distributed(self) -> Any:
        """Dask's ``distributed`` module, once the connection imported it."""
        return self.connection.distributed

    def starting(self) -> bool:
        """True while checks run here (``local_start``): the workers start, or (with a repeatable
        checker) have not all ended their warm-up check."""
        if not self.local_start:
            return False
        if not self.connection.ready.is_set():
            return True
        if self.connection.failed is not None or self.connection.closing or not self._repeatable:
            return False
        return self._warming is None or not all(f.done() for f in self._warming)

    def expect(self, remaining: Optional[int]) -> None:
        """As ``Executor.expect``: the ready workers are connected only when the checks left would
        take longer here than handing them over costs (``runner.executors.handover``)."""
        self.handover.expect(remaining, self.connection.address.is_set())

    def slot(self, worker: int, iteration: int) -> Slot:
        """The slot of a check: while the workers start (``local_start``), one that runs here as
        ``executor=local``'s do (its GPU as this process numbers it, a ``threading.Event`` to cancel
        it); else pinned to worker process ``worker``, which sees only the slot's GPU.

        Raises:
            ConfigError: the workers did not start (see ``client``).
        """
        if self.starting():
            gpu = self.gpus[worker] if self.gpus else None
            slot = Slot(worker, gpu, threading.Event(), LocalExecutor.poll_s)
            self._here.add(id(slot))
            return slot
        if self.local_checks and not self._handed_over:
            self._handed_over = True
            log.info(
                "The workers are ready: iteration %d and every later check run on them (%d ran here)",
                iteration,
                self.local_checks,
            )
        slot = super().slot(worker, iteration)
        slot.pinned = slot.gpu is not None
        return slot

    def cancel_flag(self, iteration: int) -> Any:
        """A ``distributed.Event`` named after this run and the iteration (once the workers started).

        Raises:
            ConfigError: the workers did not start (see ``client``).
        """
        client = self.client
        return self.distributed.Event(f"runner-{self.run_id}-cancel-{iteration}", client=client)

    def share(self, obj: Any) -> Any:
        """``obj`` as every check receives it: scattered to the workers when the first check goes
        to them, itself for a check run here."""
        self._repeatable = bool(getattr(obj, "repeatable", False))
        return _Shared(obj)

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> Any:
        """Start ``fn(*args)``: here, in a thread, when its slot (in ``args``) was made to run
        here; else on worker process ``worker`` and no other (its GPU is the slot's)."""
        slots = [a for a in args if isinstance(a, Slot)]
        if slots and id(slots[0]) in self._here:
            self._here.discard(id(slots[0]))
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="check")
            self.local_checks += 1
            future = self._pool.submit(fn, *(a.obj if isinstance(a, _Shared) else a for a in args))
            if (
                self._warming is None
                and self._repeatable
                and self.connection.ready.is_set()
                and self.connection.failed is None
            ):
                self._warm_workers(fn, args, slots[0])
            return future
        client, name = self.client, self.names[worker // self.threads]
        sent = [self._scatter(client, a) if isinstance(a, _Shared) else self._send(client, a, name) for a in args]
        return client.submit(fn, *sent, pure=False, workers=[name], allow_other_workers=False)

    @staticmethod
    def _send(client: Any, arg: Any, name: str) -> Any:
        """A candidate (its model built) sent straight to worker ``name`` ahead of its task: through
        the scheduler with the task, a detector's 4.7 MB took 85 ms there and back, directly 25 ms."""
        if isinstance(arg, Candidate) and arg.payload is not None:
            return client.scatter(arg, workers=[name], direct=True, hash=False)
        return arg

    def _scatter(self, client: Any, shared: _Shared) -> Any:
        """The shared checker as the workers hold it: scattered to every worker on the first call."""
        if self._scattered is None:
            self._scattered = client.scatter(shared.obj, broadcast=True, hash=False)
        return self._scattered

    def _warm_workers(self, fn: Callable[..., Verdict], args: Sequence[Any], slot: Slot) -> None:
        """Send every worker the check just started here, its verdict unused: the model's kernels
        load and its first session is made there while the rounds go on here."""
        client = self.client
        self._warming = []
        for w, name in enumerate(self.names):
            first = w * self.threads  # the process's first slot
            pinned = Slot(first, self.gpus[first] if self.gpus else None, None, self.poll_s, pinned=bool(self.gpus))
            sent = [
                self._scatter(client, a)
                if isinstance(a, _Shared)
                else pinned
                if a is slot
                else self._send(client, a, name)
                for a in args
            ]
            self._warming.append(client.submit(fn, *sent, pure=False, workers=[name], allow_other_workers=False))
        log.info(
            "Warming the %d workers with a check of a candidate checked here (its verdict is not used)", len(self.names)
        )

    @property
    def lanes(self) -> int:
        """Each slot's thread here (``local_start``; else one) and each slot on the workers."""
        return len(self._here_slots()) + self.workers

    def _here_slots(self) -> List[Slot]:
        """The slots jobs run on here: one per slot, each on its GPU, as checks while the workers
        start (``local_start``); else one, on this process's first GPU."""
        return self.thread_slots() if self.local_start else [Slot()]

    def spread(self, fn: Callable[[Any, Any], Any], shared: Any, jobs: Iterable[Any]) -> List[Any]:
        """As ``Executor.spread``: jobs run here from the start (as checks do while the workers
        start, ``_here_slots``) and, once the workers are ready, on each worker's threads as well
        (``runner.executors.lanes``); a job a worker does not finish runs here. Each job here is
        timed for the workers' start (``HandOver.job_here``; ``len(jobs)`` where it has one)."""
        lanes = worker_lanes(self.names, self.threads, self.gpus, self.poll_s)
        started = time.monotonic()
        count = len(jobs) if isinstance(jobs, Sized) else None
        ended = itertools.count(1)

        def timed(shared: Any, job: Any) -> Any:  # a job here, noted for the workers' start
            began = time.monotonic()
            result = fn(shared, job)
            done = next(ended)
            self.handover.job_here(time.monotonic() - began, None if count is None else count - done)
            return result

        try:
            results, elsewhere = spread_with_workers(
                fn, shared, jobs, self.connection.connected, lambda: self.distributed, lanes, self._here_slots(), timed
            )
        finally:
            self.handover.jobs_ended()
        log.info(
            "%d of %d jobs ran on the worker processes (%.1f s)", elsewhere, len(results), time.monotonic() - started
        )
        return results

    def result(self, future: Any, iteration: int) -> Verdict:
        """As ``Executor.result``; a worker process that died in the check is a ``CheckError``.

        Raises:
            CheckError: the check's worker process died (a crash in the backend, or killed).
        """
        if isinstance(future, concurrent.futures.Future):  # a check run here
            verdict: Verdict = future.result()
            self.handover.checked_here(float(verdict.details.get("check_s", 0.0)))
            return verdict
        try:
            return future.result()
        except self.distributed.KilledWorker:
            raise CheckError(
                f"iteration {iteration}: the check's worker process died (a crash in the backend, or killed); "
                "reduce the crash with a command check (checker=command) that runs the backend in its own process"
            ) from None

    def close(self) -> None:
        """Stop every worker process with the cluster's process, after the threads of the checks
        run here; during the start-up too, without waiting for it."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.connection.close()


class _Shared:
    """An object every check uses (the checker), kept here until a check goes to the workers."""

    def __init__(self, obj: Any):
        self.obj = obj
