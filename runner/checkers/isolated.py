"""``checker.isolate=true``: an in-process checker (python, compare) run in a child process.

An in-process check shares the runner's process: a segfault in ONNX Runtime or in a user's
``checker=python`` function, or an ``os.abort()``, ends the run with no summary. Isolated, the
bound checker lives in one child process (started with ``spawn``, so no state of the runner's
threads is copied), each check is a task sent to it, and a child that dies gives that candidate a
**crash** verdict (a failure of its own kind, ``Verdict.crash``, counted as ``crashes`` in
``summary.json``); the next check starts a new child. The idea is torch's minifier's, which runs
each repro in a subprocess; the pool is the standard library's ``ProcessPoolExecutor``.

Cost: the bound checker (its golden values) is pickled to each new child once, and each candidate's
model once per check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import onnx

from runner.candidates import Candidate, Verdict
from runner.checkers.base import Checker, Need
from runner.errors import CheckError, first_line
from runner.executors.slot import Slot
from runner.executors.worker import end_with_parent
from runner.graph.weight_file import weight_file

if TYPE_CHECKING:
    from runner.context import RunContext

log = logging.getLogger(__name__)

_CHECKER: Optional[Checker] = None


def _adopt(checker: bytes, parent: int) -> None:
    """The child's initializer: keep the bound checker (pickled, by value where cloudpickle is there),
    and end this process when the runner ``parent`` is gone (``end_with_parent``: even after ``kill -9``)."""
    global _CHECKER
    _CHECKER = pickle.loads(checker)
    end_with_parent(parent)


def _pickled(checker: Checker) -> bytes:
    """``checker`` pickled for the child: by reference where pickle can, else by value with cloudpickle
    (an API check defined in a function or a lambda).

    Raises:
        CheckError: it does not pickle.
    """
    try:
        return pickle.dumps(checker)
    except Exception as e:
        plain = first_line(e)
    try:
        import cloudpickle

        return bytes(cloudpickle.dumps(checker))
    except ImportError:
        why = f"{plain}; pip install cloudpickle to send functions defined in a function, or define it in a module"
    except Exception as e:
        why = first_line(e)
    raise CheckError(f"checker.isolate=true cannot send the check to a child process ({why})")


@dataclasses.dataclass
class _Model:
    """A candidate's model sent to the child as bytes (a payload is a closure over the strategy)."""

    data: bytes

    def __call__(self) -> onnx.ModelProto:
        return onnx.load_from_string(self.data)


def _up() -> bool:
    """A task that returns once the child has started and adopted its checker."""
    return _CHECKER is not None


#: seconds a new child gets to start and adopt its checker (not counted in ``timeout_s``)
START_S = 120.0


def _check(artifact: Optional[Path], iteration: int, candidate: Candidate) -> Verdict:
    assert _CHECKER is not None, "the child process was started without its checker"
    return _CHECKER.check(artifact, iteration, candidate)


class IsolatedChecker(Checker):
    """Runs ``inner``'s checks in a child process.

    Args:
        inner: an in-process checker (python or compare), not bound yet.
        timeout_s: seconds a check may take; past them the child is killed and the candidate counts
            as a failure (``Verdict.timeout``), as a check command past ``checker.timeout_s`` does.

    The child ends with the runner: Ctrl-C, SIGTERM or SIGHUP in the runner kill it before the
    run ends, and a runner killed outright leaves it to end itself within ``PARENT_WATCH_S``.

    Raises:
        CheckError: from ``check``, when the child cannot be started or the checker cannot be sent
            to it (it does not pickle).
    """

    def __init__(self, inner: Checker, timeout_s: Optional[float] = None):
        self.inner = inner
        self.timeout_s = timeout_s
        self.concurrent = inner.concurrent
        self.fix_hint = inner.fix_hint
        self.reads_model = inner.reads_model
        self._pool: Optional[ProcessPoolExecutor] = None
        self._children: List[Any] = []  # the pool's processes (multiprocessing.Process), for their exit codes
        self._busy = False  # a check is running in the child
        self._up = False  # the child has started and adopted the checker

    def bind(self, ctx: RunContext) -> None:
        """Bind the inner checker here (golden values are computed once, in the runner)."""
        self.inner.output_dir = self.output_dir
        self.inner.bind(ctx)

    def __getattr__(self, name: str) -> Any:
        # the inner checker's attributes (the compare checker's backend, tolerances, ...) for the modes that read them
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def needs(self, candidate: Candidate) -> Need:
        """The inner checker's need, a switched run's as its model (or file): the child gets the candidate's
        model as bytes, or reads the file; it holds no switchboard."""
        need = self.inner.needs(candidate)
        if need is Need.nothing:
            return Need.model if candidate.payload is not None else Need.file
        return need

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                1, mp_context=context, initializer=_adopt, initargs=(_pickled(self.inner), os.getpid())
            )
        return self._pool

    def check(
        self, artifact: Optional[Path], iteration: int, candidate: Candidate, slot: Optional[Slot] = None
    ) -> Verdict:
        """The inner checker's verdict on ``candidate``, computed in the child; a crash verdict when
        the child dies during the check."""
        model = weight_file().portable(candidate.payload()) if candidate.payload is not None else None
        sent = dataclasses.replace(
            candidate, write=None, payload=_Model(model.SerializeToString()) if model is not None else None
        )
        try:
            pool = self._started()
            if not self._up:  # the child's start-up is no part of the check's time (timeout_s)
                started = pool.submit(_up)
                self._children = list(getattr(pool, "_processes", {}).values())
                started.result(timeout=START_S)
                self._up = True
            future = pool.submit(_check, artifact, iteration, sent)
            self._children = list(getattr(pool, "_processes", {}).values())  # started by submit
            self._busy = True
            verdict = future.result(timeout=self.timeout_s)
            self._busy = False
            return verdict
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # the candidate does not pickle
            self._reap()
            raise CheckError(f"checker.isolate=true cannot send the check to a child process ({e})") from None
        except TimeoutError:
            starting = not self._up
            self._kill()
            if starting:
                raise CheckError(
                    f"checker.isolate=true: the child process did not start within {START_S:g} s; check that "
                    "the checker's module imports quickly"
                ) from None
            log.warning("Iteration %d: the check took over %s s; its process was killed", iteration, self.timeout_s)
            return Verdict(False, reason=f"timeout after {self.timeout_s} s", timeout=True)
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):  # a signal: the child dies with the run
                self._kill()
            if not isinstance(e, BrokenProcessPool):
                raise
            return self._crashed(iteration)

    def _crashed(self, iteration: int) -> Verdict:
        code = self._reap()
        how = _how(code)
        log.warning("Iteration %d: the check's process died (%s); counted as a crash", iteration, how)
        return Verdict(False, reason=f"the check crashed its process ({how})", crash=True)

    def _kill(self) -> None:
        """Kill the child at once (a hanging check, a signal) and drop the pool."""
        for child in self._children:
            with contextlib.suppress(Exception):
                child.kill()
        self._reap()

    def _reap(self) -> Optional[int]:
        """Shut a broken pool down; the exit code of its child, when known."""
        pool, self._pool, self._busy, self._up = self._pool, None, False, False
        if pool is None:
            return None
        pool.shutdown(wait=True, cancel_futures=True)
        for child in self._children:
            child.join(timeout=5)
        return next((c.exitcode for c in self._children if c.exitcode is not None), None)

    def close(self) -> None:
        """Stop the child (killed if a check still runs), then close the inner checker."""
        if self._pool is not None:
            if self._busy:  # a check still runs (the run ends on an error or a signal): no waiting for it
                self._kill()
            else:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
        self.inner.close()


def _how(code: Optional[int]) -> str:
    """``signal SIGSEGV`` / ``exit code 3`` / ``unknown exit``."""
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
