"""The one guard every file a run writes, replaces, moves or removes goes through: never a file a run reads.

A run registers the files it reads once, before any work (``runner.files.inputs.files_read``: the model and its
external data, ``quantized_model=`` and its data, inputs, golden values, replays, rankings, a calibration cache,
the modules of loaders and checks, every existing file a check's command or arguments name), and holds them with
``reading`` for as long as it lives. Every writer of the project (``runner.jsonio``, ``runner.graph.load``'s model
writers, figures, logs, the ledger, artifacts, golden values, engines) calls ``check_write`` with its destination
first, whatever option or default led there; so a file of the run's own directory, a file read indirectly or a key
added later cannot escape the rule, as they did while it was enforced key by key (issue 74).

The registry is per process and holds the union of the running runs' reads (runs of the API in threads of one
process are each other's readers too). Two names of the tool's own bookkeeping are never anything else's
destination: the output ledger and the run directory's lock.

This module is at the bottom of the import graph: it imports nothing of the project but ``runner.errors``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

from runner.errors import ArtifactError

#: the file names of the tool's own bookkeeping, written by their own modules only: the output ledger
#: (``runner.files.ledger``) and a run directory's lock (``runner.files.rundir``)
OWN_NAMES = (".onnx-debug-runner-outputs.json", ".runner.lock")

_lock = threading.Lock()
#: the registries of the runs of this process that are running: each ``{path as given: what it is}``
_ACTIVE: List[ReadFiles] = []


def _identity(path: Path) -> Optional[Tuple[int, int]]:
    """``(device, inode)`` of the file ``path`` leads to, or None when there is none."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


class ReadFiles:
    """The files one run reads, each with what it is (``"the model"``, ``"the inputs= file"``).

    A destination is one of them when it is the same path once links are followed (also a link to a file not
    created yet) or the same inode (a hard link).

    Args:
        files: ``{path: what it is}``; relative paths are taken from the working folder now.
    """

    def __init__(self, files: Mapping[Path, str]):
        self.files: Dict[Path, str] = {}
        self._by_identity: Dict[Tuple[int, int], Tuple[Path, str]] = {}
        self._by_real: Dict[str, Tuple[Path, str]] = {}
        for path, what in files.items():
            path = Path(path).absolute()
            self.files[path] = what
            self._by_real[os.path.realpath(path)] = (path, what)
            identity = _identity(path)
            if identity is not None:
                self._by_identity[identity] = (path, what)

    def holding(self, destination: Path) -> Optional[Tuple[Path, str]]:
        """``(path, what it is)`` of the read file ``destination`` is (or leads to), or None."""
        found = self._by_real.get(os.path.realpath(destination))
        if found is not None:
            return found
        identity = _identity(destination)
        found = self._by_identity.get(identity) if identity is not None else None
        # a read file removed since has given its inode back: a new file may have it, and is no hard link to it
        return found if found is not None and _identity(found[0]) == identity else None


@contextlib.contextmanager
def reading(files: Mapping[Path, str]) -> Iterator[ReadFiles]:
    """Hold ``files`` (``{path: what it is}``) as read by a running run until the block ends: ``check_write``
    refuses each of them as a destination meanwhile.

    Yields:
        The registry.
    """
    registry = ReadFiles(files)
    with _lock:
        _ACTIVE.append(registry)
    try:
        yield registry
    finally:
        with _lock:
            _ACTIVE.remove(registry)


def read_by_a_run(path: Path) -> Optional[Tuple[Path, str]]:
    """``(path, what it is)`` when ``path`` is a file a running run of this process reads, else None."""
    with _lock:
        registries = list(_ACTIVE)
    for registry in registries:
        found = registry.holding(Path(path))
        if found is not None:
            return found
    return None


def check_write(path: Path | str, what: str, own: bool = False) -> None:
    """Refuse to write, replace, move or remove ``path`` when a running run reads it, or when it is a name of
    the tool's own bookkeeping (``OWN_NAMES``) and the writer is not its own module (``own``).

    Args:
        path: the destination (or the file to be moved or removed).
        what: what is being written, for the message (``"output="``, ``"the run's summary"``).
        own: the caller is the ledger's or the lock's own module.

    Raises:
        ArtifactError: one line naming the destination, the file it would lose and what to change.
    """
    path = Path(path)
    if not own and path.name in OWN_NAMES:
        raise ArtifactError(
            f"cannot write {what} to {path}: {path.name} is this tool's own bookkeeping; choose another name"
        )
    found = read_by_a_run(path)
    if found is not None:
        read, role = found
        via = "" if path.absolute() == read else f" (as {read})"
        raise ArtifactError(
            f"cannot write {what} to {path}: it is {role}{via}, which this run reads; choose another path for it"
        )


def is_device(path: Path | str) -> bool:
    """Whether ``path`` is (or leads to) a character or block device, such as ``/dev/null`` or ``/dev/stdout``."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)
