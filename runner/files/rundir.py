"""Run isolation: a run directory no other run can share, and a lock held on it for the whole run.

Hydra's stock run directory (``outputs/DATE/TIME``) has one-second resolution, so two runs
started in the same second would write into one directory and overwrite each other's
candidates, replay and summary. The default here (``conf/config.yaml``) adds microseconds and
a per-process random suffix (the ``run_id`` resolver, ``runner.config_keys.RUN_ID``). Each run also takes an exclusive
``flock`` on ``<run dir>/.runner.lock``: a second run pointed at a directory in use stops at
once. The kernel drops the lock when the process ends, even after ``kill -9``.

A folder of the user's may be a run directory (``hydra.run.dir=.``), but a run never replaces a file there that no
run wrote: when the lock is first taken, a directory holding an entry of a name a run writes there and replaces
(``RUN_NAMES``, ``RUN_PATTERNS``: its summary, replay, log, figures, iteration artifact...) that no run recorded in
the directory's ledger (``runner.files.ledger``) is refused in one line, before Hydra writes its ``.hydra/`` or its
log there. The run claims the names it may write when it locks the folder and records what it wrote when it lets
go, so a later run with ``reuse_run_dir=true`` may replace them (also after a ``kill -9``). A sweep directory is
held to the same rule for its own files (``SWEEP_NAMES``). Names a run picks free (``weights_1.bin``,
``checks/iter1_1.log``, sorted artifacts) never replace anything and are not listed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.errors import ArtifactError
from runner.files.ledger import claim_run_names, record_run_files, run_file
from runner.write_guard import OWN_NAMES

LOCK_NAME = OWN_NAMES[1]

#: the names a run writes in its run directory and would replace: Hydra's snapshot and log, the summary, the
#: replay, the fatal-signal log, the checks' and artifacts' folders, the iteration artifact and its data, the modes'
#: reports (precision's ranking and trade-off figure, layerwise's table and figure, build's tactics) and the copy
#: of an invalid candidate (``tests/runner/files/test_run_names.py`` proves the list whole, mode by mode)
RUN_NAMES = (
    ".hydra",
    "runner.log",
    "summary.json",
    "replay.json",
    "fatal.log",
    "checks",
    "artifacts",
    "ranking.json",
    "tradeoff.png",
    "report.html",
    "layerwise.csv",
    "layerwise.png",
    "quantization.csv",
    "tactics.json",
    "invalid_candidate.onnx",
    "invalid_candidate.onnx.data",
)
#: the run directory's names that vary with the run (the iteration artifact by suffix and worker, a worker's
#: tactics)
RUN_PATTERNS = ("iter_artifact*", "tactics_w*.json")
#: the names a multirun writes in its sweep directory (Hydra's, the comparison table); its jobs' folders are
#: numbered (Hydra's ``hydra.sweep.subdir``), so a numbered entry there is held to the rule too
SWEEP_NAMES = ("multirun.yaml", "sweep.json", "report.html")
#: what Hydra writes into a job's directory before the job runs (a sweep's job, or a re-run from a snapshot,
#: whose config holds no callback): the run takes them for its own when it locks the directory
HYDRA_JOB_FILES = (".hydra", "runner.log")


def _run_name(name: str, names: Iterable[str], patterns: Iterable[str]) -> bool:
    return name in names or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def run_owns(run_dir: Path, path: Path) -> bool:
    """Whether ``path`` is one of the run's own files in ``run_dir``: under a name of ``RUN_NAMES`` or
    ``RUN_PATTERNS`` there (or inside such a folder), which ``refuse_foreign`` vetted when the run locked it."""
    try:
        parts = Path(path).absolute().relative_to(Path(run_dir).absolute()).parts
    except ValueError:
        try:
            parts = Path(path).resolve().relative_to(Path(run_dir).resolve()).parts
        except ValueError:
            return False
    return bool(parts) and _run_name(parts[0], RUN_NAMES, RUN_PATTERNS)


def refuse_foreign(
    path: Path,
    option: str,
    names: Iterable[str] = RUN_NAMES,
    patterns: Iterable[str] = RUN_PATTERNS,
    numbered: bool = False,
    written: Iterable[str] = (),
) -> None:
    """Refuse ``path`` as a run (or sweep) directory when it holds an entry of a name the run would replace that no
    run of this tool recorded there; else claim the free names for this run (``runner.files.ledger``).

    Args:
        path: the directory. option: the key naming it, for the message.
        names, patterns: the names the run writes there (exact, and ``fnmatch`` patterns).
        numbered: a numbered entry is one too (a sweep's job folders).
        written: names Hydra wrote for this run already (``HYDRA_JOB_FILES``): the run's.

    Raises:
        ArtifactError: naming the entries, the key and what to do.
    """
    names, patterns, written = tuple(names), tuple(patterns), tuple(written)
    try:
        present = sorted(os.listdir(path))
    except OSError:
        return  # not made yet: lock_run_dir makes it, or says why it cannot
    yours: List[str] = [
        name
        for name in present
        if (_run_name(name, names, patterns) or (numbered and name.isdigit()))
        and name not in written
        and not run_file(Path(path) / name)
    ]
    if yours:
        shown = ", ".join(yours[:6]) + (f" and {len(yours) - 6} more" if len(yours) > 6 else "")
        raise ArtifactError(
            f"{option}={path} holds {shown}, which no run of this tool wrote and a run there would replace; "
            f"move them, or give runs a folder of their own (leave {option} unset for a fresh one)"
        )
    claim_run_names(Path(path), [name for name in names if name not in present])


def record_run_dir(path: Path, names: Iterable[str] = RUN_NAMES, patterns: Iterable[str] = RUN_PATTERNS) -> None:
    """Record in ``path``'s ledger the entries of the run's names it holds now, as a run's."""
    try:
        present = os.listdir(path)
    except OSError:
        return
    record_run_files(Path(path), sorted({*names, *(n for n in present if _run_name(n, (), patterns))}))


#: run directory (resolved) -> open lock file descriptor, for the directories this process holds
_HELD: Dict[Path, int] = {}


def lock_run_dir(path: Path, option: str = "hydra.run.dir", hydra_wrote: bool = False) -> Path:
    """Create ``path`` if needed and hold an exclusive lock on it until ``release_run_dir``; when the lock is
    first taken, refuse a directory holding files of the user's under names the run writes (``refuse_foreign``).

    Idempotent within a process: a directory this process already holds is returned as is.

    Args:
        path: the run directory.
        option: the key that names it, for error messages.
        hydra_wrote: Hydra has written its job files there already (``HYDRA_JOB_FILES``: a sweep's job, a re-run
            from a snapshot): they are the run's.

    Returns:
        The directory, resolved.

    Raises:
        ArtifactError: when the directory cannot be created or written, another live run holds it, or it
            holds a file of the user's that the run would replace.
    """
    path = Path(path).resolve()
    if path in _HELD:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        made = not os.path.lexists(path / LOCK_NAME)
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
    try:
        refuse_foreign(path, option, written=HYDRA_JOB_FILES if hydra_wrote else ())
    except ArtifactError:
        if made:  # a refused folder is left as it was
            with contextlib.suppress(OSError):
                os.unlink(path / LOCK_NAME)
        os.close(fd)
        raise
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
    """Record what the run wrote in ``path`` (``record_run_dir``) and release the lock if this process holds it
    (the lock file stays, empty)."""
    fd = _HELD.pop(Path(path).resolve(), None)
    if fd is not None:
        record_run_dir(Path(path).resolve())
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
        """Check that ``hydra.sweep.dir`` can be created and holds no file of the user's under a name the sweep
        writes (``SWEEP_NAMES``); each job then locks its own directory."""

        def make() -> None:
            sweep = Path(str(config.hydra.sweep.dir))
            try:
                sweep.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ArtifactError(
                    f"hydra.sweep.dir={sweep} is not a writable directory ({e.strerror}); "
                    "choose another with hydra.sweep.dir=DIR"
                ) from None
            refuse_foreign(sweep, "hydra.sweep.dir", SWEEP_NAMES, (), numbered=True)

        _guard(make)


def _guard(action: Any) -> None:
    try:
        action()
    except ArtifactError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
