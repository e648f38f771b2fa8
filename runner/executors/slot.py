"""A running check's slot: which worker runs it, its GPU, and the flag that cancels it.

A command check learns its slot from ``RUNNER_WORKER`` (and ``CUDA_VISIBLE_DEVICES`` for its GPU);
in-process code (a TensorRT build, a checker) asks ``current()``, set for the thread running the check.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Protocol

from runner.errors import ConfigError


class CancelFlag(Protocol):
    """What cancels a running check: ``threading.Event``, or ``distributed.Event`` on a cluster."""

    def is_set(self) -> bool: ...

    def set(self) -> Any: ...

    def clear(self) -> Any: ...


class CheckCancelled(Exception):
    """Raised by a check whose slot was cancelled (Ctrl-C, or its round no longer needs it)."""


@dataclass
class Slot:
    """Where one check runs.

    Attributes:
        worker: the worker's index, 0-based (``RUNNER_WORKER``, ``{worker}`` in paths and commands).
        gpu: the GPU the check may use (``CUDA_VISIBLE_DEVICES``), or None to leave it as it is.
        cancel: set to cancel the check; None when it cannot be cancelled (a serial check, which
            Ctrl-C interrupts directly).
        poll_s: seconds between looks at ``cancel`` while a command runs.
        pinned: the check runs in a worker process that sees only ``gpu`` (its
            ``CUDA_VISIBLE_DEVICES`` was set when it started: ``executor=processes``).
    """

    worker: int = 0
    gpu: Optional[str] = None
    cancel: Optional[CancelFlag] = field(default=None, compare=False)
    poll_s: float = 0.1
    pinned: bool = False

    @property
    def device(self) -> Optional[str]:
        """The check's GPU as the process running it numbers its GPUs (an execution provider's
        ``device_id``): ``gpu``, or "0" in a pinned worker; None without a GPU."""
        if self.gpu is None:
            return None
        return "0" if self.pinned else self.gpu

    def env(self) -> Dict[str, str]:
        """The environment a check's command gets: ``RUNNER_WORKER`` and, with a GPU, ``CUDA_VISIBLE_DEVICES``
        (a pinned worker's command inherits its process's)."""
        env = {"RUNNER_WORKER": str(self.worker)}
        if self.gpu is not None and not self.pinned:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env

    def cancelled(self) -> bool:
        """True once the check should stop."""
        return self.cancel is not None and self.cancel.is_set()


_current = threading.local()


def current() -> Slot:
    """The slot of the check running in this thread (worker 0 outside any check)."""
    slot = getattr(_current, "slot", None)
    return slot if slot is not None else Slot()


def set_current(slot: Optional[Slot]) -> Optional[Slot]:
    """Make ``slot`` the current slot of this thread (None: none); return the one it replaces."""
    previous: Optional[Slot] = getattr(_current, "slot", None)
    _current.slot = slot
    return previous


def visible_gpu(gpu: str) -> str:
    """GPU ``gpu`` as this process numbers it, in the numbering its children get from
    ``CUDA_VISIBLE_DEVICES``: this process's own list maps it (``CUDA_VISIBLE_DEVICES=2,3``: GPU 0
    is "2"); without one, ``gpu`` itself.

    Raises:
        ConfigError: ``gpu`` is a number past this process's ``CUDA_VISIBLE_DEVICES``.
    """
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible or not gpu.isdigit():
        return gpu
    if int(gpu) >= len(visible):
        raise ConfigError(
            f"executor.gpus names GPU {gpu}, but this process sees {len(visible)} (CUDA_VISIBLE_DEVICES="
            f"{os.environ['CUDA_VISIBLE_DEVICES']}); number GPUs from 0 as ONNX Runtime here does"
        )
    return visible[int(gpu)]
