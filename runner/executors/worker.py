"""One worker process of ``executor=processes``: a spawned ``ProcessPoolExecutor`` of one process.

The process is pinned to its GPU (``CUDA_VISIBLE_DEVICES``, set by its initializer before anything
touches CUDA), warms itself (``_warm``: ONNX Runtime imported, a CUDA context made), holds what the
runner sends it once (``Held``: the checker with its golden values) and ends
when the runner does, even after ``kill -9`` (a watch thread sees its parent change).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import multiprocessing
import os
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from runner.executors.slot import Slot, set_current

#: how often (seconds) a worker looks whether the runner is still its parent
PARENT_WATCH_S = 0.5

#: what a check imports, imported while a worker warms: ONNX Runtime, and the modules that asked to be
#: (``warm_also``: a checker's own module registers itself, so executors never name the checkers above them)
WARM_IMPORTS: List[str] = ["onnxruntime"]


def warm_also(module: str) -> None:
    """Have worker processes started from now on import ``module`` while they warm (``_warm``)."""
    if module not in WARM_IMPORTS:
        WARM_IMPORTS.append(module)


_HELD: Dict[str, Any] = {}  # in a worker: what the runner sent once, by key


def end_with_parent(parent: int) -> None:
    """In a child process: end it (exit code 1) once the runner ``parent`` is gone, even after ``kill -9``;
    a daemon thread looks every ``PARENT_WATCH_S`` seconds whether its parent changed."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="runner-watch", daemon=True).start()


def _begin(env: Dict[str, str], parent: int) -> None:
    """A worker's initializer: pin its GPU before anything touches CUDA, and end with the runner ``parent``."""
    os.environ.update(env)
    end_with_parent(parent)


def _warm(modules: Sequence[str]) -> None:
    """A worker's first task: import what a check needs (``modules``: the runner's ``WARM_IMPORTS``) and, pinned
    to a GPU with the CUDA provider there, make its CUDA context with a one-Conv session (the second or so a new
    process pays once)."""
    for module in modules:
        importlib.import_module(module)
    import onnxruntime as ort

    if os.environ.get("CUDA_VISIBLE_DEVICES") and "CUDAExecutionProvider" in ort.get_available_providers():
        import numpy as np

        session = ort.InferenceSession(warm_model().SerializeToString(), providers=["CUDAExecutionProvider"])
        session.run(None, {"x": np.zeros((1, 1, 4, 4), np.float32)})


def warm_model() -> Any:
    """The one-Conv model ``_warm`` runs, at opset 13 and IR version 7 as written: every ONNX Runtime since 1.6
    loads it (the installed onnx's own IR version, 14 for onnx 1.20, is one ONNX Runtime 1.31 refuses)."""
    from onnx import parser

    return parser.parse_model(
        '<ir_version: 7, opset_import: ["" : 13]> warm (float[1,1,4,4] x) => (float[1,1,4,4] y) '
        "<float[1,1,1,1] w = {1.0}> { y = Conv(x, w) }"
    )


def _hold(key: str, obj: Any) -> None:
    _HELD[key] = obj


def _drop(key: str) -> None:
    _HELD.pop(key, None)


def _call(fn: Callable[..., Any], args: Tuple[Any, ...], slot: Optional[Slot] = None) -> Any:
    """A task in a worker: ``fn(*args)`` with each ``Held`` replaced by what it names, ``slot`` current."""
    set_current(slot)
    try:
        return fn(*(_HELD[a.key] if isinstance(a, Held) else a for a in args))
    finally:
        set_current(None)


class Held:
    """An object every task uses (the checker): sent to each worker once."""

    def __init__(self, obj: Any):
        self.obj, self.key = obj, uuid.uuid4().hex

    def __getstate__(self) -> Dict[str, Any]:  # to a worker only its key travels
        return {"obj": None, "key": self.key}


class Worker:
    """One worker process (a spawned ``ProcessPoolExecutor`` of one process) and what it holds.

    Args:
        env: its environment additions (``CUDA_VISIBLE_DEVICES``).
    """

    def __init__(self, env: Dict[str, str]):
        context = multiprocessing.get_context("spawn")
        self.pool = concurrent.futures.ProcessPoolExecutor(
            1, mp_context=context, initializer=_begin, initargs=(env, os.getpid())
        )
        #: done once the process has started and warmed (``_warm``)
        self.ready = self.pool.submit(_warm, tuple(WARM_IMPORTS))
        self._held: Set[str] = set()

    def call(self, fn: Callable[..., Any], args: Sequence[Any], slot: Optional[Slot] = None) -> Any:
        """``fn(*args)`` in the worker, after its queued tasks; a ``Held`` is sent the first time only."""
        for held in (a for a in args if isinstance(a, Held) and a.key not in self._held):
            self.pool.submit(_hold, held.key, held.obj)
            self._held.add(held.key)
        return self.pool.submit(_call, fn, tuple(args), slot)

    def drop(self, held: Held) -> None:
        """Let go of ``held`` in the worker (after its queued tasks), if it was ever sent."""
        if held.key in self._held:
            self._held.discard(held.key)
            with contextlib.suppress(RuntimeError):  # a dead or shut pool holds nothing any more
                self.pool.submit(_drop, held.key)

    def kill(self) -> None:
        """End the process now, whatever it runs."""
        for process in list(getattr(self.pool, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)
