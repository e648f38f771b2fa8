"""Python callables given to the API as checks, known by a digest of what they compute.

``runner.api`` registers a callable check here under a key that ``checker.args`` carries, so the
key is part of the run's identity (``runner.files.identity``): a replay made by another function, in
this process or another, is refused as a replay of another check, and the same function defined
again (a re-run script) finds its replay. The key digests the function's code (bytecode,
constants, names, nested functions), its defaults, and the values its closure and a bound
method's object hold (pickled, else their ``repr``); the function's name alone would give every
process's first function the same key.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import threading
import types
from typing import Any, Callable, Dict, Set, Tuple

_registry: Dict[str, Tuple[Callable[[str], Any], int]] = {}  # key -> (callable, runs using it)
_lock = threading.Lock()

#: the python checker's target for registered callables
TARGET = "runner.callables.call"


def _value(h: hashlib._Hash, value: Any, seen: Set[int]) -> None:
    """Feed ``value`` into ``h``: code and functions by what they compute, anything else pickled (or its repr)."""
    if id(value) in seen:
        h.update(b"<cycle>")
        return
    seen.add(id(value))
    if isinstance(value, types.CodeType):
        h.update(value.co_code)
        h.update(repr((value.co_names, value.co_varnames, value.co_freevars, value.co_argcount)).encode())
        for const in value.co_consts:
            _value(h, const, seen)
    elif isinstance(value, functools.partial):
        _value(h, value.func, seen)
        _value(h, value.args, seen)
        _value(h, sorted(value.keywords.items()), seen)
    elif isinstance(value, types.MethodType):
        _value(h, value.__func__, seen)
        _value(h, value.__self__, seen)
    elif isinstance(value, types.FunctionType):
        h.update(f"{value.__module__}.{value.__qualname__}".encode())
        _value(h, value.__code__, seen)
        _value(h, value.__defaults__, seen)
        _value(h, sorted((value.__kwdefaults__ or {}).items()), seen)
        for cell in value.__closure__ or ():
            try:
                _value(h, cell.cell_contents, seen)
            except ValueError:  # an empty cell
                h.update(b"<empty>")
    elif isinstance(value, (tuple, list)):
        h.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _value(h, item, seen)
    elif callable(value) and not isinstance(value, type) and hasattr(value, "__dict__"):
        h.update(f"{type(value).__module__}.{type(value).__qualname__}".encode())
        _value(h, type(value).__call__, seen)
        try:
            h.update(pickle.dumps(vars(value), protocol=4))
        except Exception:  # unpicklable state: its repr
            h.update(repr(vars(value)).encode())
    else:
        try:
            h.update(pickle.dumps(value, protocol=4))
        except Exception:
            h.update(repr(value).encode())


def digest(fn: Callable[..., Any]) -> str:
    """A stable key for ``fn``: ``fn_`` and 16 hex digits of sha256 over what it computes.

    Two functions with the same code, defaults and closure values get the same key, in any process;
    any difference in them gives another.
    """
    h = hashlib.sha256()
    _value(h, fn, set())
    return "fn_" + h.hexdigest()[:16]


def register(fn: Callable[[str], Any]) -> str:
    """Register ``fn`` for a run (counted: call ``release`` after it); its key."""
    key = digest(fn)
    with _lock:
        _, uses = _registry.get(key, (fn, 0))
        _registry[key] = (fn, uses + 1)
    return key


def release(key: str) -> None:
    """One run is done with ``key``; the callable is dropped when no run uses it (the registry does not grow)."""
    with _lock:
        fn, uses = _registry.get(key, (None, 0))
        if uses <= 1:
            _registry.pop(key, None)
        elif fn is not None:
            _registry[key] = (fn, uses - 1)


def lookup(key: str) -> Callable[[str], Any]:
    """The callable registered under ``key``.

    Raises:
        KeyError: no callable of that key is registered in this process (a config written by an
            API run, replayed from the command line, names a function only that process had).
    """
    with _lock:
        found = _registry.get(key)
    if found is None:
        raise KeyError(
            f"no Python function {key} is registered in this process: an API call's check runs only in the "
            "process that made the call"
        )
    return found[0]


def call(artifact: str, key: str) -> bool:
    """The python checker's target for a registered callable (``checker.args=[key]``)."""
    return bool(lookup(key)(artifact))
