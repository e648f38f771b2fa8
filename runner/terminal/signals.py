"""SIGTERM and SIGHUP end a run the way Ctrl-C does: the check is killed, the summary says "interrupted".

A signal handler raises ``Interrupted`` (a ``KeyboardInterrupt``) in the main thread, so the same
cleanup runs for all three; the exit code is 128 + the signal number (130, 143, 129), as a shell
reports a process ended by that signal. Ctrl-C (SIGINT) raises ``Interrupted`` too, so that a
``KeyboardInterrupt`` a user's code raises itself (a data loader's) is told apart from a person's.
"""

from __future__ import annotations

import contextlib
import signal
from contextlib import contextmanager
from typing import Any, Iterator

#: the signals that end a run as Ctrl-C does (Ctrl-C itself among them)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """Raised by the handler of SIGTERM or SIGHUP.

    Args:
        signum: the signal's number.
    """

    def __init__(self, signum: int):
        super().__init__(f"signal {signal.Signals(signum).name}")
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def _raise(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def install() -> None:
    """Handle SIGTERM and SIGHUP like Ctrl-C for the rest of the process (main thread only)."""
    for sig in SIGNALS:
        signal.signal(sig, _raise)


@contextmanager
def handled() -> Iterator[None]:
    """Handle SIGTERM and SIGHUP like Ctrl-C inside the block, then restore the previous handlers.

    Outside the main thread (where handlers cannot be set) the block runs unchanged.
    """
    try:
        previous = {sig: signal.signal(sig, _raise) for sig in SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def fatal_log(path: Any) -> Iterator[Any]:
    """Log fatal signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) of this process to ``path`` for
    the ``with`` block (Python's ``faulthandler``, every thread's traceback): a run that dies of one
    leaves a non-empty file, a run killed from outside (SIGKILL) an empty one. The file is removed
    when the block ends normally or by an exception, and ``faulthandler`` is set back as it was (to
    stderr if it was on, e.g. under pytest).

    Args:
        path: the log file (a ``pathlib.Path``); None: do nothing.

    Yields:
        ``path``.
    """
    import faulthandler
    import os
    import sys

    if path is None:
        yield None
        return
    from runner.write_guard import check_write

    check_write(path, "the fatal-signal log")
    was_on = faulthandler.is_enabled()
    log = open(path, "w")  # noqa: SIM115 (faulthandler writes to it until the block ends)
    faulthandler.enable(file=log, all_threads=True)
    try:
        yield path
    finally:
        faulthandler.disable()
        log.close()
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.unlink(path)
        if was_on:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                faulthandler.enable(file=sys.__stderr__ or sys.stderr, all_threads=True)
