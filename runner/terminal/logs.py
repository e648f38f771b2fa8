"""How much a run logs, in which form, and where besides the terminal: Polygraphy's ``-v``/``-vv``,
``--verbosity``, ``--log-format`` and ``--log-file`` as keys.

- ``verbose=1`` (or ``true``, Polygraphy's ``-v``): every logger of the run at DEBUG; ``verbose=2`` (``-vv``):
  also ONNX Runtime's own log at its verbose severity (sessions, providers, graph transformations).
- ``verbosity=[LEVEL]`` or ``verbosity=[MODULE:LEVEL, ...]`` (``--verbosity``): one level for the run, or a
  level per module (``strategies.precision:debug``; a path such as ``runner/lowp/convert.py`` names
  ``runner.lowp.convert``). Levels are Python's (debug, info, warning, error, critical) or Polygraphy's
  names (ultra_verbose ... verbose read as debug; start, finish, pass as info).
- ``log_format=[timestamp, line-info, no-colors]`` (``--log-format``): what a terminal line carries besides the
  logger, level and message: the time (the default), the file and line. The log has no colors, so
  ``no-colors`` changes nothing and is taken as Polygraphy spells it.
- ``log_file=PATH`` (``--log-file``): every line of the run also goes to ``PATH``, in the terminal's format;
  the path follows the output rule (``runner.files.outputs``: never a file the run reads, never one no run
  wrote). ``runner.log`` in the run directory keeps every line with its time whatever these keys say.

Standard ``logging`` only: levels on loggers, formatters on the terminal's handlers, one ``FileHandler``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

from runner.errors import ConfigError
from runner.terminal.console import terminal_handlers
from runner.write_guard import check_write

#: level names a ``verbosity`` entry may give: Python's and Polygraphy's (``polygraphy.logger.Logger``)
LEVELS: Dict[str, int] = {
    "ultra_verbose": logging.DEBUG,
    "super_verbose": logging.DEBUG,
    "extra_verbose": logging.DEBUG,
    "verbose": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "start": logging.INFO,
    "finish": logging.INFO,
    "pass": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
#: what ``log_format`` may list
FORMATS = ("timestamp", "line-info", "no-colors")
#: this project's top-level packages, whose loggers ``log_file`` hears from INFO up
PACKAGES = ("runner", "strategies", "statemachine", "conf")
#: ONNX Runtime's logger severities: 0 verbose, 2 warning (its default)
ORT_VERBOSE, ORT_DEFAULT = 0, 2


@dataclass(frozen=True)
class LogSettings:
    """The run's log keys, checked (``settings``).

    Attributes:
        verbose: 0, 1 (DEBUG for every logger) or 2 (also ONNX Runtime's own log).
        levels: ``{logger name: level}`` from ``verbosity`` ("" is the root logger).
        format: the ``logging.Formatter`` format of terminal lines and ``log_file``.
    """

    verbose: int = 0
    levels: Dict[str, int] = field(default_factory=dict)
    format: str = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def _verbose(value: Any) -> int:
    if value is None or isinstance(value, bool):
        return int(bool(value))
    if isinstance(value, int) and value in (0, 1, 2):
        return value
    raise ConfigError(f"verbose={value!r}: give 0, 1 (or true: debug lines) or 2 (also ONNX Runtime's own log)")


def _level(word: str, entry: str) -> int:
    level = LEVELS.get(word.strip().lower().replace("-", "_"))
    if level is None:
        raise ConfigError(
            f"verbosity entry {entry!r}: {word!r} is no level; give one of {', '.join(LEVELS)} "
            "(as LEVEL or MODULE:LEVEL)"
        )
    return level


def _module(name: str, entry: str) -> str:
    """A logger name from a module name or a path to its file (``runner/lowp/convert.py``)."""
    dotted = name.strip().removesuffix(".py").replace("/", ".").strip(".")
    try:  # the whole name: runner.nope names no module, though runner is one
        found = bool(dotted) and importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"verbosity entry {entry!r}: no module {name!r}; name a module or a path such as "
            "strategies.precision or runner/lowp/convert.py"
        )
    return dotted


def settings(verbose: Any = 0, verbosity: Any = (), log_format: Any = ("timestamp",)) -> LogSettings:
    """The log keys, checked.

    Args:
        verbose: ``verbose=`` (bool, 0, 1 or 2).
        verbosity: ``verbosity=`` entries, each ``LEVEL`` or ``MODULE:LEVEL`` (a single string is one entry).
        log_format: ``log_format=`` entries from ``FORMATS``.

    Returns:
        The ``LogSettings``.

    Raises:
        ConfigError: a value outside what each key takes (the message names the entry and what to give).
    """
    entries = [verbosity] if isinstance(verbosity, str) else list(verbosity or ())
    levels: Dict[str, int] = {}
    for entry in entries:
        text = str(entry)
        module, _, word = text.rpartition(":")
        levels[_module(module, text) if module else ""] = _level(word, text)
    formats = [log_format] if isinstance(log_format, str) else list(log_format or ())
    unknown = [f for f in formats if str(f) not in FORMATS]
    if unknown:
        raise ConfigError(f"log_format={unknown[0]}: give a list of {', '.join(FORMATS)} (or [] for neither)")
    parts = ["[%(asctime)s]" if "timestamp" in formats else "", "[%(name)s][%(levelname)s]"]
    if "line-info" in formats:
        parts.append("[%(filename)s:%(lineno)d]")
    return LogSettings(_verbose(verbose), levels, "".join(parts) + " - %(message)s")


@contextlib.contextmanager
def applied(log: LogSettings) -> Iterator[None]:
    """Apply ``log`` for the duration of a run: levels on the loggers, the format on the terminal's handlers,
    ONNX Runtime's severity at ``verbose=2``; everything as it was afterwards (a process that runs more)."""
    undo: List[Callable[[], None]] = []
    try:
        levels = dict(log.levels)
        if log.verbose and "" not in levels:
            levels[""] = logging.DEBUG
        for name, level in levels.items():
            logger = logging.getLogger(name or None)
            undo.append(functools.partial(logger.setLevel, logger.level))
            logger.setLevel(level)
        for handler in terminal_handlers():
            undo.append(functools.partial(handler.setFormatter, handler.formatter))
            handler.setFormatter(logging.Formatter(log.format))
        if log.verbose >= 2:
            import onnxruntime

            onnxruntime.set_default_logger_severity(ORT_VERBOSE)
            undo.append(lambda: onnxruntime.set_default_logger_severity(ORT_DEFAULT))
        yield
    finally:
        for step in reversed(undo):
            step()


@contextlib.contextmanager
def log_file(path: Path, log: LogSettings) -> Iterator[logging.FileHandler]:
    """Every line of the run also into ``path`` (``log_file=``), in ``log``'s format, until the block ends.

    Args:
        path: the file, already claimed by the output plan (``runner.files.outputs``): replaced.
        log: the run's log settings.

    Raises:
        OSError: the file cannot be opened.
        ArtifactError: ``path`` is a file a running run reads (``runner.write_guard``).
    """
    check_write(path, "log_file=")
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter(log.format))
    root = logging.getLogger()
    root.addHandler(handler)
    # the run's own lines reach it from INFO up even where nothing configured logging (a program calling the API)
    quieter = [lg for lg in map(logging.getLogger, PACKAGES) if lg.getEffectiveLevel() > logging.INFO]
    levels = [lg.level for lg in quieter]
    for logger in quieter:
        logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        for logger, level in zip(quieter, levels):
            logger.setLevel(level)
        root.removeHandler(handler)
        handler.close()
