"""The executor interface and the check task every executor runs.

An executor runs ``run_check`` for each candidate of a round and reports the checks as they end;
the lifecycle (``statemachine/lifecycle.py``) owns rounds, sorting and the replay. Executors hand
out ``concurrent.futures.Future``s (a cluster's or a worker process's future is relayed: ``relay``).
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence

from runner.candidates import Candidate, Verdict
from runner.errors import ConfigError
from runner.executors.slot import CheckCancelled, Slot, set_current
from runner.executors.spread import HERE
from runner.write_guard import check_write

if TYPE_CHECKING:  # a run of no model imports no ONNX
    import onnx


@dataclass(frozen=True)
class Shipped:
    """A candidate's model, built before the check is sent elsewhere: the payload a check task calls."""

    model: onnx.ModelProto

    def __call__(self) -> onnx.ModelProto:
        return self.model


def shipped(candidate: Candidate, executor: str) -> Candidate:
    """``candidate`` with its model built here (a task elsewhere cannot call back into the strategy)
    (``Candidate.portable``): what a check in another process receives.

    Raises:
        ConfigError: the candidate is built in its check (TensorRT engines), on this machine only.
    """
    if candidate.write_in_check:
        raise ConfigError(
            "this mode's candidates are built in the check (TensorRT engines) on this machine; "
            f"use executor=local executor.gpus=[...] instead of {executor}"
        )
    from runner.graph.weight_file import weight_file

    # a large model's candidate points into this process's weight file: it travels with its values
    payload = Shipped(weight_file().portable(candidate.payload())) if candidate.payload is not None else None
    return candidate.portable(payload)


def run_check(checker: Any, artifact: Path, iteration: int, candidate: Candidate, slot: Slot) -> Verdict:
    """The task of one check: write the artifact when the candidate writes it in its check (a
    TensorRT build), then ``checker.check`` it, with ``slot`` as this thread's current slot.

    Args:
        checker: a ``runner.checkers.base.Checker``.
        artifact: the slot's iteration artifact path.
        iteration: the 1-based iteration number.
        candidate: the candidate (``payload`` already built when the check runs elsewhere).
        slot: the check's slot (worker, GPU, cancel flag).

    Returns:
        The verdict, with ``check_s``: the seconds ``checker.check`` took where it ran
        (the lifecycle adds ``verdict_s``: the seconds from handing the check over to its verdict).

    Raises:
        CheckCancelled: the slot was cancelled before or during the check.
        Whatever the checker raises (a RunnerError stops the run).
    """
    set_current(slot)
    try:
        if slot.cancelled():
            raise CheckCancelled(f"iteration {iteration}")
        if candidate.write_in_check and candidate.write is not None:
            check_write(artifact, f"iteration {iteration}'s artifact")
            Path(artifact).parent.mkdir(parents=True, exist_ok=True)
            candidate.write(Path(artifact))
        start = time.perf_counter()
        verdict: Verdict = checker.check(artifact, iteration, candidate, slot=slot)
        verdict.check_s = round(time.perf_counter() - start, 4)
        return verdict
    finally:
        set_current(None)


def relay(
    source: Any, error: Optional[Callable[[BaseException], BaseException]] = None
) -> concurrent.futures.Future[Verdict]:
    """A ``concurrent.futures.Future`` that ends as ``source`` ends (a ``distributed.Future``, or a worker
    process's future), and that ``cancel`` ends at once even while ``source`` runs: the check is
    abandoned (it ends where it runs, unseen), so a round or a stopping run does not wait for it.

    Args:
        source: a future with ``add_done_callback``, ``cancelled``, ``exception``, ``result`` and ``cancel``.
        error: maps what ``source`` raised to what the relay raises (default: the same).
    """
    proxy: concurrent.futures.Future[Verdict] = concurrent.futures.Future()

    def ended(_: Any) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
            if proxy.cancelled():
                return
            if source.cancelled():
                proxy.cancel()
            elif (failed := source.exception()) is not None:
                proxy.set_exception(error(failed) if error is not None else failed)
            else:
                proxy.set_result(source.result())

    def dropped(_: Any) -> None:
        if proxy.cancelled():
            proxy.set_running_or_notify_cancel()  # ``concurrent.futures.wait`` counts it as ended only then
            source.cancel()

    source.add_done_callback(ended)
    proxy.add_done_callback(dropped)
    return proxy


class Shared(Protocol):
    """What ``Executor.share`` takes: the run's checker (``runner.checkers.base.Checker``'s traits)."""

    #: the check runs in the calling process (not a program of its own)
    in_process: bool


class Executor(abc.ABC):
    """Runs checks: ``workers`` at once. ``submit`` hands out ``concurrent.futures.Future``s: a round
    waits for them with ``concurrent.futures.wait`` and drops one with ``cancel`` (a started check also
    stops by its slot's cancel flag, or is abandoned where it runs: ``relay``).

    Args:
        workers: checks at once (>= 1).
        gpus: GPU ids; each running check gets one (``CUDA_VISIBLE_DEVICES``), so ``workers``
            may not exceed their number. Empty: checks see every GPU.
        lookahead: while a round's checks run elsewhere, the runner builds the candidates the next
            round may hold (``Strategy.lookahead``); off for checks that need this machine's CPU.

    Attributes:
        name: the executor's name for the summary ("serial", "local", "processes", "dask").
        elsewhere: checks run in other processes: a check receives its candidate built (``shipped``).
        threaded: checks run on threads of this process, so this thread is free while one runs: with one worker
            too, the runner builds each candidate here before its check and the next round's likely ones while it
            runs (``lookahead``), as it does with several.

    Raises:
        ConfigError: ``workers`` < 1, or more workers than GPUs.
    """

    name = ""
    elsewhere = False
    threaded = False
    #: seconds between looks at a cancel flag while a command check runs
    poll_s = 0.1

    def __init__(self, workers: int = 1, gpus: Optional[Sequence[Any]] = None, lookahead: bool = False):
        self.gpus: List[str] = [str(g) for g in (gpus or [])]
        self.lookahead = bool(lookahead)
        if int(workers) < 1:
            raise ConfigError(f"executor.workers={workers} must be 1 or more checks at once")
        if self.gpus and int(workers) > len(self.gpus):
            raise ConfigError(
                f"executor.workers={workers} with {len(self.gpus)} GPUs (executor.gpus): each running check gets "
                f"one GPU; set executor.workers={len(self.gpus)} or fewer, or list more GPUs"
            )
        self.workers = int(workers)

    def gpu(self, worker: int) -> Optional[str]:
        """Worker ``worker``'s GPU (0-based), or None without ``gpus``."""
        return self.gpus[worker] if self.gpus else None

    def slot(self, worker: int, iteration: int) -> Slot:
        """The slot of the check of ``iteration`` on worker ``worker`` (0-based), with a fresh cancel
        flag (``_cancel_flag``)."""
        return Slot(worker, self.gpu(worker), self._cancel_flag(iteration), self.poll_s)

    def _cancel_flag(self, iteration: int) -> Any:
        """A fresh flag that cancels one check; None here: a serial check, which Ctrl-C interrupts."""
        return None

    def share(self, obj: Shared) -> Any:
        """What to pass to ``submit`` for the object every check uses (the checker); itself here."""
        return obj

    @abc.abstractmethod
    def submit(self, fn: Callable[..., Verdict], *args: Any, worker: int = 0) -> concurrent.futures.Future[Verdict]:
        """Start ``fn(*args)`` for the check of slot ``worker`` (0-based); return its future."""

    def lanes(self) -> Sequence[Any]:
        """Where ``runner.executors.spread.spread`` runs jobs that are not checks: one lane in this thread here."""
        return HERE

    def facts(self, started: float) -> Dict[str, Any]:
        """This executor's own fields for ``summary.json`` (none here).

        Args:
            started: the run's start, ``time.monotonic()`` seconds.
        """
        return {}

    def close(self) -> None:
        """Release threads, worker processes or the cluster connection."""
