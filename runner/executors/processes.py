"""``executor=processes``: checks in worker processes on this machine, ``per_gpu`` pinned to each GPU.

Each worker (``worker.Worker``) is a spawned process that keeps the checker it was sent once, with its
golden values and cached sessions; check ``i`` of a round runs on worker ``i``. One rule says when they
start: with ``start="lazy"`` (the default), once a check or job run here (after the first) takes
``DEAR_S`` or more; with ``start="now"``, with the run. Until every worker is ready the checks run
here, in threads. docs/executors.md gives the why; benchmarks/README.md ("GPU checks") the figures.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, List, Optional, Sequence

from runner.candidates import Verdict
from runner.config import Start
from runner.errors import ConfigError, WorkerDiedError, first_line
from runner.executors.base import Executor, Shared, relay
from runner.executors.slot import Slot, visible_gpu
from runner.executors.spread import Lane
from runner.executors.worker import Held, Worker

log = logging.getLogger(__name__)

#: seconds a check or job run here must take (after the first) for ``start="lazy"`` to start the workers
DEAR_S = 1.0


class ProcessExecutor(Executor):
    """``workers`` worker processes (``Worker``), one check at a time each, started as ``start`` says
    and stopped when the run ends, on an error or on Ctrl-C.

    Args:
        workers: worker processes; with ``gpus`` it must be ``len(gpus) * per_gpu`` (the default),
            without them the default is 2.
        gpus: GPU ids as this process numbers them; each gets ``per_gpu`` workers pinned to it.
        per_gpu: workers per GPU (>= 1): two let one convert and build its session while the other runs.
        lookahead: as ``Executor``'s.
        timeout_s: seconds the workers get to start and warm; past them the next check raises.
        local_start: run the checks of rounds that start before every worker is ready here (threads,
            each on its slot's GPU); False: every check runs in a worker (a check that may crash its process).
        start: ``Start.lazy`` (see the module) or ``Start.now`` (or their names); without ``local_start``,
            always now.

    Raises:
        ConfigError: ``per_gpu`` < 1, ``workers`` disagreeing with ``gpus`` and ``per_gpu``, ``start``
            neither ``"lazy"`` nor ``"now"``; from a round's first check, workers that failed to start
            or did not within ``timeout_s``.
    """

    name = "processes"
    elsewhere = True

    def __init__(
        self,
        workers: Optional[int] = None,
        gpus: Optional[Sequence[Any]] = None,
        per_gpu: int = 1,
        lookahead: bool = True,
        timeout_s: float = 30.0,
        local_start: bool = True,
        start: Start | str = Start.lazy,
    ):
        if int(per_gpu) < 1:
            raise ConfigError(f"executor.per_gpu={per_gpu} must be 1 or more workers per GPU")
        if getattr(start, "value", start) not in {s.value for s in Start}:
            renamed = " (auto is now lazy)" if start == "auto" else ""
            raise ConfigError(f"executor.start={start} must be lazy (once a check here is dear) or now{renamed}")
        start = Start(getattr(start, "value", start))
        listed = [str(g) for g in (gpus or [])]
        pinned = [g for g in listed for _ in range(int(per_gpu))]
        if listed and workers is not None and int(workers) != len(pinned):
            raise ConfigError(
                f"executor.workers={workers} with {len(listed)} GPUs and executor.per_gpu={per_gpu}: "
                f"executor=processes starts {len(pinned)} workers; drop executor.workers or set executor.per_gpu"
            )
        super().__init__(len(pinned) if listed else (workers if workers is not None else 2), pinned, lookahead)
        self.timeout_s, self.local_start = float(timeout_s), bool(local_start)
        self._env = [{"CUDA_VISIBLE_DEVICES": visible_gpu(g)} if g else {} for g in (pinned or [""] * self.workers)]
        self._processes: List[Worker] = []
        self._lock = threading.Lock()
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None  # the checks run here
        self._timed = 0  # checks and jobs timed here
        self._handed_over = False
        #: when the workers were started (``time.monotonic()``), None while they are not
        self.launched_at: Optional[float] = None
        self._ready_at: Optional[float] = None
        #: checks run here before the workers were ready
        self.local_checks = 0
        if start is Start.now or not self.local_start:
            self.start()
        when = "now" if self.launched_at else f"once a check here takes {DEAR_S:g} s or more (executor.start=lazy)"
        log.info("%d worker processes%s: they start %s", self.workers, f" on GPUs {listed}" if listed else "", when)

    def start(self) -> None:
        """Start the worker processes (once)."""
        with self._lock:
            if self.launched_at is None:
                self.launched_at = time.monotonic()
                self._processes = [Worker(env) for env in self._env]
                for process in self._processes:
                    process.ready.add_done_callback(self._one_ready)

    def _one_ready(self, future: concurrent.futures.Future[None]) -> None:
        """A worker started (or failed to): the log says when the last one is ready."""
        if self._ready_at is None and all(p.ready.done() and not p.ready.exception() for p in self._processes):
            self._ready_at = time.monotonic()
            log.info("%d worker processes ready after %.1f s", self.workers, self._ready_at - (self.launched_at or 0))

    def _took_here(self, seconds: float) -> None:
        """A check or job ran here in ``seconds``: a dear one starts the workers (``start="lazy"``)."""
        self._timed += 1
        if self._timed > 1 and seconds >= DEAR_S and self.launched_at is None:
            log.info("A check here took %.1f s: starting the %d worker processes", seconds, self.workers)
            self.start()

    def ready(self, wait_s: float = 0.0) -> bool:
        """True once every worker has started and warmed, waiting up to ``wait_s`` seconds for it.

        Raises:
            ConfigError: a worker failed to start, or they were not ready within ``timeout_s`` of their start.
        """
        if self.launched_at is None:
            return False
        if self._ready_at is None:
            left = self.timeout_s - (time.monotonic() - self.launched_at)
            concurrent.futures.wait([p.ready for p in self._processes], timeout=max(0.0, min(wait_s, left)))
            if not all(p.ready.done() for p in self._processes):
                if left <= wait_s:
                    raise ConfigError(
                        f"the worker processes did not start within executor.timeout_s={self.timeout_s} s; "
                        "raise it, or use executor=local"
                    )
                return False
            for failed in (p.ready.exception() for p in self._processes):
                if failed is not None:
                    raise ConfigError(f"a worker process failed to start: {first_line(failed)}")
        return True

    def slot(self, worker: int, iteration: int) -> Slot:
        """A check's slot: here (a ``threading.Event`` to cancel it) with ``local_start`` while the workers
        are not ready, else on worker process ``worker``, which sees only the slot's GPU (no flag: a running
        check ends).

        Raises:
            ConfigError: see ``ready``.
        """
        if self.local_start and not self.ready():  # a slot here is the one with a cancel flag
            return Slot(worker, self.gpu(worker), threading.Event(), self.poll_s)
        if self.local_checks and not self._handed_over:
            self._handed_over = True
            log.info(
                "The workers are ready: iteration %d and later run there (%d ran here)", iteration, self.local_checks
            )
        return Slot(worker, self.gpu(worker), None, self.poll_s, pinned=bool(self.gpus))

    def share(self, obj: Shared) -> Held:
        """``obj`` (the checker) as checks receive it: sent to each worker once.

        Raises:
            ConfigError: a checker that runs a program (``in_process`` false): a worker could not stop it.
        """
        if not obj.in_process:
            raise ConfigError(
                "executor=processes runs in-process checks (checker=compare or checker=python); a check command is "
                "its own process already: use executor=local executor.workers=N (or executor.gpus=[...])"
            )
        return Held(obj)

    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> concurrent.futures.Future[Verdict]:
        """Start ``fn(*args)``: in a thread here when its slot was made to run here (it has a cancel flag),
        else on worker ``worker`` (started, and ready within ``timeout_s``, first).

        Raises:
            ConfigError: see ``ready``.
        """
        slot = next((a for a in args if isinstance(a, Slot)), None)
        if slot is None or slot.cancel is None:
            self.start()
            self.ready(self.timeout_s)
            return relay(self._processes[worker].call(fn, args), _died)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="check")
        self.local_checks += 1
        here = tuple(a.obj if isinstance(a, Held) else a for a in args)
        future = self._pool.submit(fn, *here)
        future.add_done_callback(self._timed_check)
        return future

    def _timed_check(self, future: concurrent.futures.Future[Verdict]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._took_here(future.result().check_s or 0.0)

    def lanes(self) -> List[Lane]:
        """A lane per worker: its jobs run in a thread here on the worker's GPU, each timed for
        ``start="lazy"``, until the worker is ready, and in the worker after (``runner.executors.spread.held``).
        Without ``local_start``, every job waits for its worker (up to ``timeout_s``)."""
        return [Lane(Slot(w, self.gpu(w)), self._took_here, _WorkerLane(self, w)) for w in range(self.workers)]

    def facts(self, started: float) -> Dict[str, Any]:
        """``local_checks`` (checks run here while the workers started; with ``local_start``) and
        ``workers_started_s`` (seconds from ``started`` to the workers' start, null when they never did)."""
        launched = None if self.launched_at is None else round(self.launched_at - started, 3)
        return {**({"local_checks": self.local_checks} if self.local_start else {}), "workers_started_s": launched}

    def close(self) -> None:
        """Stop every worker process (killed if a check still runs), after the threads of the checks run here."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for process in self._processes:
            process.kill()


class _WorkerLane:
    """Worker ``worker`` of ``executor`` as a lane's ``Remote``: ready once every worker is, then it runs
    the lane's jobs on its own GPU."""

    def __init__(self, executor: ProcessExecutor, worker: int):
        self.executor, self.worker = executor, worker

    def ready(self) -> bool:
        """True once the workers are ready; without ``local_start`` they are waited for (``ready``'s
        errors raised), with it a worker that failed to start leaves the jobs here."""
        if not self.executor.local_start:
            self.executor.start()
            return self.executor.ready(self.executor.timeout_s)
        try:
            return self.executor.ready()
        except ConfigError:
            return False

    def call(self, fn: Callable[..., Any], shared: Held, job: Any) -> Any:
        """``fn(shared, job)`` in the worker, pinned to its GPU; a dead worker raises ``WorkerDiedError``."""
        slot = Slot(self.worker, self.executor.gpu(self.worker), None, self.executor.poll_s, bool(self.executor.gpus))
        process = self.executor._processes[self.worker]
        try:
            return process.call(fn, (shared, job), slot).result()
        except BrokenProcessPool as e:
            raise _died(e) from None

    def drop(self, shared: Held) -> None:
        """Let go of ``shared`` in the worker, once it was started."""
        if self.executor.launched_at is not None:
            self.executor._processes[self.worker].drop(shared)


def _died(error: BaseException) -> BaseException:
    """What a worker's check raises, as the run reports it: a dead worker process is a ``WorkerDiedError``."""
    if isinstance(error, BrokenProcessPool):
        return WorkerDiedError(
            "the check's worker process died (a crash in the backend, or killed); reduce the crash with a "
            "command check (checker=command) that runs the backend in its own process"
        )
    return error
