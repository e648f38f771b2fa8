"""Standard output and error that outlive their reader: ``| head`` or a closed ``less`` never ends a run.

When the reader of a pipe goes away, the next write raises ``BrokenPipeError``; from the progress
bar or a log line that would end the search with no answer and no summary. ``guard_streams``
wraps ``sys.stdout`` and ``sys.stderr`` so that the first such write points the stream's file
descriptor at ``/dev/null`` instead: the run goes on quietly, and its answer, ``summary.json`` and
``runner.log`` are written as always. Standard library only (installed before the heavy imports).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO


class QuietWhenClosed:
    """A text stream that swallows ``BrokenPipeError`` by sending the rest of its output to ``/dev/null``.

    Args:
        stream: the stream to wrap (``sys.stdout`` or ``sys.stderr``).

    Attributes:
        closed_reader: whether the reader went away (the stream now writes to ``/dev/null``).
    """

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.closed_reader = False

    def _silence(self) -> None:
        self.closed_reader = True
        with contextlib.suppress(OSError, ValueError):  # no file descriptor (a StringIO): nothing to redirect
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)

    def write(self, text: str) -> int:
        """Write ``text``; once the reader is gone, the write succeeds into ``/dev/null``."""
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        """Flush; a reader that went away is silenced, not an error."""
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()
            with contextlib.suppress(OSError):
                self._stream.flush()  # the buffered rest now goes to /dev/null

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_streams() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in ``QuietWhenClosed`` (once; idempotent)."""
    if not isinstance(sys.stdout, QuietWhenClosed):
        sys.stdout = QuietWhenClosed(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, QuietWhenClosed):
        sys.stderr = QuietWhenClosed(sys.stderr)  # type: ignore[assignment]
