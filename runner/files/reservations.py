"""Names reserved for a run's outputs: created empty and locked (``flock``) so that two runs started together never
get the same name, and an empty name no running run holds taken back (a killed run reserved and never wrote it).
``runner.files.outputs`` holds the rule that decides which name an output gets; this module the file-system part.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Callable, Optional, Tuple

from runner.files.artifacts import split_name

log = logging.getLogger(__name__)


def held(path: Path) -> Optional[int]:
    """A descriptor holding the ``flock`` of the existing file ``path``, or None when a running run holds it
    (or it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def reserve(path: Path, free: Optional[Callable[[Path], bool]] = None) -> Tuple[Path, int]:
    """Reserve ``path``, else the first free ``stem_N.suffix``: create it empty and locked (``create_held``:
    concurrent runs never get the same name) or take back an empty one that no run holds (``abandoned``).
    ``free`` says whether a name may be taken besides (a model's data file beside it is no user's).

    Returns:
        The reserved path, and an open descriptor holding its ``flock`` (the caller closes it when the
        run ends: ``OutputPlan.release``).

    Raises:
        OSError: when the directory cannot be written.
    """
    stem, suffix = split_name(path.name)
    n = 0
    while True:
        candidate = path if n == 0 else path.with_name(f"{stem}_{n}{suffix}")
        if free is not None and not free(candidate):
            n += 1
            continue
        fd = create_held(candidate)
        if fd is not None:
            return candidate, fd
        fd = abandoned(candidate)
        if fd is not None:
            log.info("%s is an empty name reserved by a run that was killed; this run takes it back", candidate)
            return candidate, fd
        n += 1


def create_held(path: Path) -> Optional[int]:
    """Create ``path`` empty and already locked, or None when the name exists. The file is made and
    locked under a temporary name, then linked into place (``link`` fails on an existing name), so no
    other run ever sees it unlocked and takes it for a killed run's. Where hard links or locks are not
    to be had, ``O_EXCL`` alone (a killed run's name then stays taken).

    Raises:
        OSError: the directory cannot be written.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.reserving")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.link(temporary, path)
        return fd
    except FileExistsError:
        os.close(fd)
        return None
    except OSError:  # no hard links or no locks here
        os.close(fd)
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def abandoned(path: Path) -> Optional[int]:
    """A descriptor holding the ``flock`` of ``path`` when it is an empty regular file that no process
    holds: a name a killed run reserved and never wrote (its lock went with it). None for anything
    else: a file with content, a link, one a running run holds, or a file system without locks."""
    try:
        # no O_TRUNC: a file with content stays as it is; O_NONBLOCK: a FIFO of that name does not hang
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_size == 0:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None
