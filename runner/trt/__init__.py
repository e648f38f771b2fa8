"""TensorRT support (optional ``trt`` extra). Nothing here imports tensorrt at module import time."""

from __future__ import annotations

import importlib
from types import ModuleType

from runner.errors import MissingExtraError


def load_tensorrt(purpose: str) -> ModuleType:
    """Import and return the ``tensorrt`` module.

    Args:
        purpose: what needs it, for the error message (e.g. "mode=build").

    Raises:
        MissingExtraError: when TensorRT is not installed (names the ``trt`` extra).
    """
    try:
        trt = importlib.import_module("tensorrt")
    except ImportError:
        raise MissingExtraError("tensorrt", "trt", purpose) from None
    if not hasattr(trt, "Builder"):  # e.g. only tensorrt-stubs' .pyi files: a namespace package
        raise MissingExtraError("tensorrt", "trt", purpose)
    return trt


def tensorrt_available() -> bool:
    """True when a real TensorRT (not only its type stubs) can be imported."""
    try:
        load_tensorrt("a check")
    except MissingExtraError:
        return False
    return True
