"""Which files in a directory earlier runs of this tool wrote, and for which key: the ledger behind "an output
never replaces a file no run wrote" (``runner.files.outputs``).

Each directory a run writes a named output into gets one small JSON file, ``LEDGER``: for each file a run
wrote there, the key it was written for (``output``, ``save_golden``, ...) and the file's identity when the
run ended (device, inode, size, modification time in nanoseconds). A file counts as this tool's for a key only
while its identity is still the recorded one: a file a person edited, replaced or copied in since is theirs.
The ledger is read and rewritten under an exclusive ``flock``, so runs ending together keep every entry; an
unreadable ledger (a kill mid-write) is an empty one, which only ever makes a run write a ``_1`` name instead
of replacing a file, never the other way round.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Mapping, Optional

log = logging.getLogger(__name__)

#: the ledger's file name in each directory that holds outputs named by a user
LEDGER = ".onnx-debug-runner-outputs.json"
FORMAT, VERSION = "onnx-debug-runner written files", 1


def _identity(path: Path) -> Optional[List[int]]:
    """``[device, inode, size, mtime in ns]`` of the file ``path`` leads to, or None when there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
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
    (its files then count as no run's: a later run writes ``_1`` names beside them), with a debug line.

    Args:
        written: the files, each existing and whole.
    """
    by_dir: Dict[Path, Dict[str, str]] = {}
    for path, key in written.items():
        by_dir.setdefault(path.parent, {})[path.name] = key
    for directory, files in by_dir.items():
        try:
            _update(directory / LEDGER, files)
        except OSError as e:
            log.debug("Could not record the outputs written in %s (%s)", directory, e)


def _update(ledger: Path, files: Mapping[str, str]) -> None:
    """Add ``files`` (``{name: key}``) to ``ledger`` under its lock, dropping stale entries.

    Raises:
        OSError: the ledger cannot be opened or written.
    """
    fd = os.open(ledger, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    with contextlib.closing(os.fdopen(fd, "r+", encoding="utf-8")) as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        entries = _entries(f.read())
        for name, key in files.items():
            identity = _identity(ledger.parent / name)
            if identity is not None and identity[2] > 0:
                entries[name] = {"key": key, "identity": identity}
        entries = {
            name: entry for name, entry in entries.items() if entry.get("identity") == _identity(ledger.parent / name)
        }
        f.seek(0)
        f.truncate()
        json.dump({"format": FORMAT, "version": VERSION, "files": entries}, f, indent=1, sort_keys=True)
        f.flush()
