"""Atomic JSON and CSV writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from runner.write_guard import check_write


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: the process's umask, read once (reading it means setting it)
UMASK = _umask()


def write_json_atomic(path: Path, data: Any, what: str = "a JSON file", own: bool = False) -> None:
    """Write ``data`` as indented JSON to ``path`` through a temp file and ``os.replace``.

    Args:
        path: destination; its parent directory is created if missing. Created with the user's
            umask (as ``open`` would), not mkstemp's 0600.
        data: a JSON-able object.
        what: what the file is, for the guard's message.
        own: the file is the tool's own bookkeeping (``runner.write_guard.OWN_NAMES``), written by its module.

    Raises:
        OSError: when the directory cannot be created or written.
        ArtifactError: ``path`` is a file a running run reads (``runner.write_guard``).
    """
    path = Path(path)
    check_write(path, what, own)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~UMASK)  # mkstemp makes 0600; the file gets the user's umask as open() would
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str, what: str) -> None:
    """``text`` to ``path`` (UTF-8), atomically, as ``write_csv_atomic`` writes.

    Raises:
        OSError: the file cannot be written.
        ArtifactError: ``path`` is a file a running run reads (``runner.write_guard``).
    """
    check_write(path, what)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")  # a name not UTF-8 shows escaped
        os.chmod(tmp, 0o666 & ~UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_csv_atomic(path: Path, lines: Sequence[Sequence[Any]]) -> None:
    """CSV ``lines`` to ``path``, atomically: written beside it and moved into place; a write that
    fails (a full disk, a file-size limit) leaves neither a partial file nor the temporary one.

    Raises:
        OSError: the file cannot be written.
        ArtifactError: ``path`` is a file a running run reads (``runner.write_guard``).
    """
    check_write(path, "a CSV file")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows(lines)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
