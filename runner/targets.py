"""A user's Python function named by a dotted path (``checker.target=``, ``data_loader=``), with one-line errors.

Hydra's ``get_method`` says why an import failed in three lines and logs them once more at ERROR; here the
longest importable prefix of the path is the module and the rest are attributes of it (``pkg.mod.fn``,
``pkg.mod.Class.method``), and each failure is one line that names the part that is missing.
"""

from __future__ import annotations

import importlib
from typing import Any, Type

from runner.errors import RunnerError, first_line


def locate(target: str, option: str, error: Type[RunnerError]) -> Any:
    """The object ``target`` names: a module on ``sys.path``, then attributes of it.

    Args:
        target: a dotted path, e.g. ``my_checks.no_nan``.
        option: the option that gave it, for messages (``checker.target``).
        error: the error to raise.

    Returns:
        The object (the caller checks that it is callable).

    Raises:
        ``error``: ``target`` is not a dotted path; no prefix of it is a module; importing the module raises
        (a module it imports is missing, or its own code fails); the module lacks an attribute named.
    """
    parts = target.split(".")
    if len(parts) < 2 or not all(parts):
        raise error(f"{option}={target!r} is not module.function; write e.g. {option}=my_checks.check")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if missing and (module_name == missing or module_name.startswith(missing + ".")):
                continue  # this prefix is no module: a shorter one may be, with the rest as attributes
            raise error(f"{option}={target}: cannot import {module_name} ({first_line(e)})") from None
        except Exception as e:  # the module's own code
            raise error(
                f"{option}={target}: importing {module_name} raises {type(e).__name__}: {first_line(e)}"
            ) from None
        for k in range(cut, len(parts)):
            try:
                found = getattr(found, parts[k])
            except AttributeError:
                raise error(f"{option}={target}: {'.'.join(parts[:k])} has no {parts[k]}") from None
        return found
    raise error(
        f"{option}={target}: cannot import {parts[0]} (no module named {parts[0]!r}); put it on PYTHONPATH or in "
        "the working directory"
    )
