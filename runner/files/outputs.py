"""Every path a run writes, resolved and checked before the first check: no file the run reads is ever one.

``plan_outputs`` resolves each output option once. A path that is a file the run reads (the model,
its external data, ``inputs=``, ``golden=``, ``replay.load=``, a check's script: ``runner.files.inputs``),
or a link to one (symbolic, also through a link to a file not yet created, or hard), is a
one-line error naming both paths and the key to change; so is an ``artifacts.paths`` entry that is
or contains one (artifacts are moved after each check). A default name that would overwrite an
existing file gets a free name instead (logged); two options naming the same file, also through
links, are an error; and each location is proved writable, so an unwritable ``output=`` stops the
run before the search, not after it.

A default name is reserved by creating it empty, and the run holds a ``flock`` on it until it ends:
an empty file that no running run holds is one a killed run (``kill -9``) reserved and never wrote,
and the next run takes it back instead of moving on to ``reduced_1.onnx``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from runner.errors import ArtifactError, ConfigError
from runner.files.artifacts import ensure_writable_dir, split_name

log = logging.getLogger(__name__)


def _same(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same path once links are followed (also a link to a
    file not created yet), or hard links to one inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(directory: Path, path: Path) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (links followed)."""
    d, p = directory.resolve(), path.resolve()
    return p == d or d in p.parents


@dataclass
class OutputPlan:
    """The resolved output paths of one run.

    Attributes:
        paths: ``{option: path}`` for every file the run writes that the user can name.
        protected: ``{path: what it is}`` of the files the run reads (never written or moved).
    """

    paths: Dict[str, Path] = field(default_factory=dict)
    protected: Dict[Path, str] = field(default_factory=dict)
    #: ``{reserved default output: the open descriptor holding its flock while the run lives}``
    reserved: Dict[Path, int] = field(default_factory=dict)

    def release(self) -> None:
        """Remove reserved default outputs the run left empty (it stopped before writing them), then let
        go of their locks."""
        for path, fd in self.reserved.items():
            try:
                if path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass
            os.close(fd)
        self.reserved.clear()

    def get(self, option: str) -> Optional[Path]:
        """The resolved path of ``option``, or None when the run does not write it."""
        return self.paths.get(option)


def _companions(option: str, path: Path) -> List[Path]:
    """Files written beside ``path``: a model's external data file."""
    return [path.with_name(path.name + ".data")] if option in MODEL_OUTPUTS else []


#: options whose file is an ONNX model (may get ``<name>.data`` beside it)
MODEL_OUTPUTS = {"output", "min_good", "artifacts.iter_artifact"}


def plan_outputs(
    options: Dict[str, Optional[str | Path]],
    defaults: Dict[str, str],
    protected: Mapping[Path, str],
    artifact_paths: Iterable[str] = (),
) -> OutputPlan:
    """Resolve and check every output path before any work.

    Args:
        options: ``{option: value}`` as the user gave them (None when unset).
        defaults: ``{option: file name}`` used when an option is unset (e.g. ``output`` ->
            ``reduced.onnx``); a default that would overwrite an existing file is replaced by a
            free name (``reduced_1.onnx``), and the log says so.
        protected: ``{path: what it is}`` of the files the run reads (``runner.files.inputs.files_read``),
            never written or moved.
        artifact_paths: ``artifacts.paths`` (files the check produces, moved into good/ and bad/).

    Returns:
        The plan. Default-named outputs are reserved (created empty, exclusively), so two runs
        started together in one directory never pick the same name; ``OutputPlan.release``
        removes the ones a failed run left empty.

    Raises:
        ArtifactError: an output is a protected file (or its data file would be, or a link leads
            there), two options name the same file, an ``artifacts.paths`` entry is or holds a
            protected file, or a location cannot be written.
        ConfigError: an output's directory does not exist.
    """
    plan = OutputPlan(protected={Path(p): what for p, what in protected.items()})
    try:
        _plan_into(plan, options, defaults, artifact_paths)
    except BaseException:
        plan.release()  # nothing of a refused plan stays behind
        raise
    return plan


def _plan_into(
    plan: OutputPlan, options: Dict[str, Optional[str | Path]], defaults: Dict[str, str], artifact_paths: Iterable[str]
) -> None:
    for option, value in options.items():
        given = value or defaults.get(option)
        if not given:
            continue
        path = Path(given).absolute()
        if not value:
            _check_writable(option, path)
            free, fd = reserve(path)
            plan.reserved[free] = fd
            if free != path:
                log.warning("%s exists; writing %s=%s instead (set %s= to choose)", path, option, free, option)
            path = free
        for target in [path, *_companions(option, path)]:
            for p, what in plan.protected.items():
                if _same(target, p):
                    raise ArtifactError(
                        f"{option}={given} would overwrite {what} {p}"
                        f"{f' (through {target})' if target != path else ''}; choose another {option}="
                    )
        for other, other_path in plan.paths.items():
            if other_path == path or _same(path, other_path):
                raise ArtifactError(f"{option} and {other} both name {path}; give them different paths")
        _check_writable(option, path)
        plan.paths[option] = path
    for entry in artifact_paths:
        moved = Path(entry.replace("{worker}", "0")).absolute()
        for p, what in plan.protected.items():
            if _same(moved, p) or _inside(moved, p):
                how = "is" if _same(moved, p) else "holds"
                raise ArtifactError(
                    f"artifacts.paths lists {entry}, which {how} {what} {p}; artifacts are moved into "
                    "good/ and bad/ after each check, so list only files or folders the check writes"
                )


def reserve(path: Path) -> Tuple[Path, int]:
    """Reserve ``path``, else the first free ``stem_N.suffix``: create it empty and locked (``_create_held``:
    concurrent runs never get the same name) or take back an empty one that no run holds (``_abandoned``).

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
        fd = _create_held(candidate)
        if fd is not None:
            return candidate, fd
        fd = _abandoned(candidate)
        if fd is not None:
            log.info("%s is an empty name reserved by a run that was killed; this run takes it back", candidate)
            return candidate, fd
        n += 1


def _create_held(path: Path) -> Optional[int]:
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


def _abandoned(path: Path) -> Optional[int]:
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


def _check_writable(option: str, path: Path) -> None:
    """The file ``path`` can be written: its directory exists (created for run files) and takes a file."""
    parent = path.parent
    if not parent.exists() and option in ("output", "min_good", "save_golden"):
        raise ConfigError(f"{option}={path}: directory {parent} does not exist; create it or choose another path")
    if path.is_dir():
        raise ArtifactError(f"{option}={path} is a directory; give a file path")
    ensure_writable_dir(parent, option, for_file=path)
    if path.exists() and not os.access(path, os.W_OK):
        raise ArtifactError(f"{option}={path} exists and is not writable; choose another path or fix its permissions")
