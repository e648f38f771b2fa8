"""Which files in a directory earlier runs of this tool wrote, and for which key: the ledger behind "an output
never replaces a file no run wrote" (``runner.files.outputs``).

Each directory a run writes a named output into gets one small JSON file, ``LEDGER``: for each file a run
wrote there, the key it was written for (``output``, ``save_golden``, ...) and the file's identity when the
run ended (device, inode, size, modification time in nanoseconds). A file counts as this tool's for a key only
while its identity is still the recorded one: a file a person edited, replaced or copied in since is theirs.
A run directory's ledger also holds the run's own files (``RUN_KEY``): the names a run claims when it locks the
directory, then what it wrote under them when it ends; a folder given as a run directory that holds a file of one
of those names that no run recorded is the user's, and refused (``runner.files.rundir``).
The ledger is read and rewritten under an exclusive ``flock``, so runs ending together keep every entry, and
replaced whole (written beside it, then moved), so a full disk leaves the old one; an unreadable ledger is an
empty one, which only ever makes a run write a ``_1`` name instead of replacing a file, never the other way round.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

from runner.errors import ArtifactError
from runner.jsonio import write_json_atomic
from runner.write_guard import OWN_NAMES, check_write

log = logging.getLogger(__name__)

#: the ledger's file name in each directory that holds outputs named by a user
LEDGER = OWN_NAMES[0]
FORMAT, VERSION = "onnx-debug-runner written files", 1


def _identity(path: Path, whole: bool = True) -> Optional[List[int]]:
    """``[device, inode, size, mtime in ns]`` of the file ``path`` leads to, or None when there is none; only
    ``[device, inode]`` for a folder (whose size and time change as files come and go) or with ``whole`` False (a
    run directory's files, which its log and Hydra may still touch after the run recorded them)."""
    try:
        st = path.stat()
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode) or not whole:
        return [st.st_dev, st.st_ino]
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _entries(text: str) -> Dict[str, Dict[str, object]]:
    """The ledger's ``{file name: {key, identity}}``; empty for anything that is not a ledger."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        return {}
    return {str(k): v for k, v in data["files"].items() if isinstance(v, dict)}


def written_for(path: Path) -> Optional[str]:
    """The key an earlier run of this tool wrote ``path`` for, when the file is still the one it wrote; else None.

    Args:
        path: an existing file (absolute).
    """
    try:
        text = (path.parent / LEDGER).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    entry = _entries(text).get(path.name)
    if entry is None or entry.get("identity") != _identity(path):
        return None
    key = entry.get("key")
    return key if isinstance(key, str) else None


def record(written: Mapping[Path, str]) -> None:
    """Record that this run wrote each file of ``written`` (``{absolute path: key}``), one ledger per directory;
    entries whose file is gone or changed are dropped. A directory whose ledger cannot be written keeps none
    (its files then count as no run's: a later run writes ``_1`` names beside them), with a warning line.

    Args:
        written: the files, each existing and whole.
    """
    by_dir: Dict[Path, Dict[str, Optional[Dict[str, object]]]] = {}
    for path, key in written.items():
        identity = _identity(path)
        if identity is not None and (len(identity) == 2 or identity[2] > 0):
            by_dir.setdefault(path.parent, {})[path.name] = {"key": key, "identity": identity}
    for directory, files in by_dir.items():
        _record_in(directory, files)


#: the key of a run directory's own files (``runner.files.rundir``)
RUN_KEY = "run directory"


def claim_run_names(directory: Path, names: Iterable[str]) -> None:
    """Record that a run of this tool is about to write each of ``names`` in its run ``directory`` (free now):
    whatever a run killed before it could ``record_run_files`` leaves under them stays the tool's, for a run
    that reuses the directory (``reuse_run_dir=true``)."""
    _record_in(directory, {name: {"key": RUN_KEY, "identity": None} for name in names})


def record_run_files(directory: Path, names: Iterable[str]) -> None:
    """Record the run directory's files (and folders) of ``names`` as a run's, each as it is now; a claimed name
    the run left unwritten is dropped."""
    changes: Dict[str, Optional[Dict[str, object]]] = {}
    for name in names:
        identity = _identity(directory / name, whole=False)
        changes[name] = {"key": RUN_KEY, "identity": identity} if identity is not None else None
    _record_in(directory, changes)


def run_file(path: Path) -> bool:
    """Whether a run of this tool wrote ``path`` in its run directory (or claimed its name and was killed), and
    nobody replaced or edited it since."""
    try:
        text = (path.parent / LEDGER).read_text()
    except (OSError, UnicodeDecodeError):
        return False
    entry = _entries(text).get(path.name)
    if entry is None or entry.get("key") != RUN_KEY:
        return False
    return entry.get("identity") is None or entry.get("identity") == _identity(path, whole=False)


def _current(path: Path, entry: Dict[str, object]) -> bool:
    """Whether ``entry`` still describes ``path``: a claim (no identity yet), or the file as recorded."""
    identity = entry.get("identity")
    return identity is None or identity == _identity(path, whole=entry.get("key") != RUN_KEY)


def _record_in(directory: Path, changes: Mapping[str, Optional[Dict[str, object]]]) -> None:
    """``_update`` the ledger of ``directory``; a ledger that cannot be written is a warning line (its files
    count as no run's: a later run writes ``_1`` names beside them or refuses the folder as a run directory)."""
    try:
        _update(directory / LEDGER, changes)
    except (OSError, ArtifactError) as e:
        log.warning(
            "Could not record what this run wrote in %s (%s); a later run takes those files for yours",
            directory,
            getattr(e, "strerror", None) or e,
        )


def _update(ledger: Path, changes: Mapping[str, Optional[Dict[str, object]]]) -> None:
    """Apply ``changes`` (``{name: entry, or None to drop it}``) to ``ledger`` under its lock, dropping entries
    whose file changed since (claims, with no identity yet, stay). The new ledger is written beside it and moved
    into place, so a full disk leaves the old one whole; a run that waited for the lock of a ledger replaced
    meanwhile opens the new one.

    Raises:
        OSError: the ledger cannot be opened or written.
        ArtifactError: the ledger is a file a running run reads.
    """
    check_write(ledger, "the output ledger", own=True)
    while True:
        fd = os.open(ledger, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        with contextlib.closing(os.fdopen(fd, "r+", encoding="utf-8")) as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                current = os.stat(ledger, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (current.st_dev, current.st_ino) != (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                continue  # another run replaced it while this one waited: lock the new one
            entries = _entries(f.read())
            for name, entry in changes.items():
                if entry is None:
                    entries.pop(name, None)
                else:
                    entries[name] = entry
            entries = {name: entry for name, entry in entries.items() if _current(ledger.parent / name, entry)}
            write_json_atomic(
                ledger, {"format": FORMAT, "version": VERSION, "files": entries}, "the output ledger", own=True
            )
            return
