"""Run isolation: a run directory no other run can share, and a lock held on it for the whole run.

Hydra's stock run directory (``outputs/DATE/TIME``) has one-second resolution, so two runs
started in the same second would write into one directory and overwrite each other's
candidates, replay and summary. The default here (``conf/config.yaml``) adds microseconds and
a per-process random suffix (the ``run_id`` resolver, ``runner.config_keys.RUN_ID``). Each run also takes an exclusive
``flock`` on ``<run dir>/.runner.lock``: a second run pointed at a directory in use stops at
once. The kernel drops the lock when the process ends, even after ``kill -9``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from pathlib import Path
from typing import Any, Dict

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.errors import ArtifactError

LOCK_NAME = ".runner.lock"

#: run directory (resolved) -> open lock file descriptor, for the directories this process holds
_HELD: Dict[Path, int] = {}


def lock_run_dir(path: Path, option: str = "hydra.run.dir") -> Path:
    """Create ``path`` if needed and hold an exclusive lock on it until ``release_run_dir``.

    Idempotent within a process: a directory this process already holds is returned as is.

    Args:
        path: the run directory.
        option: the key that names it, for error messages.

    Returns:
        The directory, resolved.

    Raises:
        ArtifactError: when the directory cannot be created or written, or another live run
            holds it.
    """
    path = Path(path).resolve()
    if path in _HELD:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ArtifactError(
            f"{option}={path} is not a writable directory ({e.strerror}); choose another with {option}=DIR"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ArtifactError(
                f"{option}={path} is in use by another running run; give each run its own "
                f"directory (leave {option} unset for a fresh one)"
            ) from None
        raise ArtifactError(
            f"{option}={path}: cannot lock it ({e.strerror}); choose another with {option}=DIR"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[path] = fd
    return path


#: files that show a directory holds a run that got as far as writing them
RUN_FILES = ("summary.json", "replay.json")


def refuse_finished(path: Path, reuse: bool, option: str = "hydra.run.dir") -> None:
    """Refuse a run directory that holds another run's summary or replay, unless ``reuse``.

    Raises:
        ArtifactError: ``path`` holds ``summary.json`` or ``replay.json`` and ``reuse`` is False.
    """
    found = [name for name in RUN_FILES if (Path(path) / name).exists()]
    if found and not reuse:
        # a run that ended before its first check (a bad option) wrote a summary but no replay: nothing to resume
        resume = f" (resume it with replay.load={Path(path) / 'replay.json'})" if "replay.json" in found else ""
        raise ArtifactError(
            f"{option}={path} holds a finished run ({', '.join(found)}), which this run would overwrite; "
            f"choose a fresh directory{resume} or set reuse_run_dir=true to replace it"
        )


def release_run_dir(path: Path) -> None:
    """Release the lock on ``path`` if this process holds it (the lock file stays, empty)."""
    fd = _HELD.pop(Path(path).resolve(), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


class RunDirGuard(Callback):
    """Hydra callback: lock the run directory before Hydra writes anything into it.

    ``on_run_start`` runs before Hydra creates the directory and saves ``.hydra/``, so a run
    pointed at a directory another run holds stops without touching that run's files, and an
    unwritable ``hydra.run.dir`` is one line, not a traceback (exit code 2).
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Lock ``hydra.run.dir`` and refuse one holding a finished run (before Hydra writes its
        ``.hydra/`` there); print one line and exit 2 when that is impossible."""
        path = Path(str(config.hydra.run.dir))
        _guard(lambda: lock_run_dir(path))
        _guard(lambda: refuse_finished(path, bool(config.get("reuse_run_dir", False))))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check that ``hydra.sweep.dir`` can be created (each job then locks its own directory)."""

        def make() -> None:
            sweep = Path(str(config.hydra.sweep.dir))
            try:
                sweep.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ArtifactError(
                    f"hydra.sweep.dir={sweep} is not a writable directory ({e.strerror}); "
                    "choose another with hydra.sweep.dir=DIR"
                ) from None

        _guard(make)


def _guard(action: Any) -> None:
    try:
        action()
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
