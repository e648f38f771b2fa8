"""What a run prints on the terminal: ``quiet=`` and ``silent=`` (Polygraphy's ``-q`` and ``--silent``).

- ``quiet=0`` (default): log lines from INFO up, the progress bar, the result table.
- ``quiet=1``: warnings and errors only, no progress bar; the result table.
- ``quiet=2``: errors only: the ``error:`` line of a failed run, or nothing (read ``summary.json``).
- ``silent=true``: nothing at all on stdout or stderr; the exit code, ``runner.log`` and
  ``summary.json`` say how the run went.

Only the terminal is quieted: ``runner.log`` in the run directory keeps every line.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Callable, List, Tuple

from runner.errors import ConfigError

_level = {"quiet": 0, "silent": False}
_saved: List[Tuple[logging.Handler, int]] = []


def configure(quiet: Any = 0, silent: bool = False, verbose: bool = False) -> None:
    """Set the run's terminal output and the level of the console log handlers (not the files).

    Raises:
        ConfigError: ``quiet`` is not 0, 1 or 2, or is combined with ``verbose=true``.
    """
    try:
        level = int(quiet)
    except (TypeError, ValueError):
        raise ConfigError(f"quiet={quiet}: give 0, 1 (warnings and errors) or 2 (errors only)") from None
    if level not in (0, 1, 2):
        raise ConfigError(f"quiet={quiet}: give 0, 1 (warnings and errors) or 2 (errors only)")
    if verbose and (level or silent):
        raise ConfigError("verbose=true asks for more output and quiet=/silent= for less; keep one")
    _level["quiet"], _level["silent"] = level, bool(silent)
    if not level and not silent:
        return
    console = logging.CRITICAL + 1 if silent else {1: logging.WARNING, 2: logging.ERROR}[level]
    for handler in terminal_handlers():
        _saved.append((handler, handler.level))
        handler.setLevel(console)


def terminal_handlers() -> List[logging.Handler]:
    """The root logger's handlers that write to the terminal (streams that are no files: ``runner.log`` is one)."""
    return [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]


def restore() -> None:
    """Give the console handlers their levels back and the defaults (the end of a run in a process
    that runs more, such as the tests)."""
    while _saved:
        handler, level = _saved.pop()
        handler.setLevel(level)
    _level["quiet"], _level["silent"] = 0, False


def progress_bar() -> bool:
    """Whether the progress bar is drawn."""
    return _level["quiet"] == 0 and not _level["silent"]


def error(text: str) -> None:
    """Print an ``error:`` line to stderr unless silent; a closed terminal or pipe is no second error."""
    if not _level["silent"]:
        with contextlib.suppress(OSError, ValueError):
            print(text, file=sys.stderr, flush=True)


def result(show: Callable[[], None]) -> None:
    """Call ``show`` (prints a result table to stdout) unless ``quiet=2`` or silent."""
    if _level["quiet"] < 2 and not _level["silent"]:
        show()
