"""Artifact policy: sort what each check produced into good/ and bad/, never overwriting anything."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Iterable, List, Optional

from runner.candidates import Verdict
from runner.errors import ArtifactError
from runner.write_guard import check_write

log = logging.getLogger(__name__)


def ensure_writable_dir(path: Path, what: str, for_file: Optional[Path] = None) -> Path:
    """Create ``path`` if needed and prove it is writable by creating and removing a file.

    Args:
        path: a directory.
        what: the option that names it, for the error message (e.g. "artifacts.dir").
        for_file: the file the option names in ``path``, when it names a file (``output=``), for the message.

    Returns:
        The directory, as an absolute path.

    Raises:
        ArtifactError: when the directory cannot be created or written.
    """
    path = Path(path).absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        if for_file is not None:
            raise ArtifactError(
                f"{what}={for_file}: its directory {path} is not writable ({e.strerror}); choose another path"
            ) from None
        raise ArtifactError(
            f"{what}={path} is not a writable directory ({e.strerror}); choose another with {what}=DIR"
        ) from None
    return path


def unique_path(path: Path) -> Path:
    """Return ``path`` if nothing exists there, else ``stem_1.suffix``, ``stem_2.suffix``, ..."""
    if not path.exists():
        return path
    stem, suffix = split_name(path.name)
    n = 1
    while True:
        candidate = path.with_name(f"{stem}_{n}{suffix}")
        if not candidate.exists():
            return candidate
        n += 1


def split_name(name: str) -> tuple[str, str]:
    """Split ``model.onnx`` into ("model", ".onnx"); a name without a dot has no suffix."""
    if "." in name.lstrip("."):
        stem, _, ext = name.rpartition(".")
        return stem, "." + ext
    return name, ""


def remove_partial(path: Path) -> None:
    """Remove a file or folder a failed write left behind (nothing if it is not there)."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def worker_path(path: Path, worker: int, workers: int = 1) -> Path:
    """The path a check in slot ``worker`` uses for ``path``: ``{worker}`` in it becomes the index;
    without one, a run of several workers puts ``_w<index>`` before the suffix (``a.onnx`` ->
    ``a_w2.onnx``), and a serial run keeps ``path``."""
    text = str(path)
    if "{worker}" in text:
        return Path(text.replace("{worker}", str(worker)))
    if workers <= 1:
        return Path(path)
    stem, suffix = split_name(Path(path).name)
    return Path(path).with_name(f"{stem}_w{worker}{suffix}")


class ArtifactSorter:
    """Moves each check's artifacts into ``dir/good`` or ``dir/bad`` after each iteration.

    Sorted names carry the iteration number, a timestamp and the check's return code, as
    Polygraphy's do: ``{stem}_iter{N}_{YYYYmmdd-HHMMSS}_rc{code}{suffix}``.

    Args:
        paths: files or directories the check produces (moved, not copied).
        out_dir: where ``good/`` and ``bad/`` (and ``intermediate/``) are created.
        keep_intermediate: also keep a copy of every iteration artifact in ``intermediate/``.

    Raises:
        ArtifactError: when ``out_dir`` is not writable.
    """

    def __init__(self, paths: Iterable[str], out_dir: Path, keep_intermediate: bool = False):
        self.paths: List[Path] = [Path(p) for p in paths]
        self.keep_intermediate = keep_intermediate
        self.out_dir = Path(out_dir).absolute()
        if self.paths or keep_intermediate:
            ensure_writable_dir(self.out_dir, "artifacts.dir")
        self.sorted_count = {"good": 0, "bad": 0}

    def _name(self, src: Path, iteration: int, verdict: Verdict) -> str:
        stem, suffix = split_name(src.name)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        rc = "na" if verdict.returncode is None else str(verdict.returncode)
        return f"{stem}_iter{iteration}_{stamp}_rc{rc}{suffix}"

    def sort(self, iteration: int, verdict: Verdict, worker: int = 0) -> List[Path]:
        """Move every artifact path into good/ or bad/ by ``verdict.passed``.

        Args:
            iteration: the 1-based iteration number.
            verdict: the check's verdict for this iteration.
            worker: the worker slot that ran the check: ``{worker}`` in a path becomes it.

        Returns:
            The new paths of the artifacts that existed (a missing one is a warning).

        Raises:
            ArtifactError: when an artifact cannot be moved, or is a file a running run reads
                (``runner.write_guard``).
        """
        side = "good" if verdict.passed else "bad"
        moved = []
        for src in (worker_path(p, worker) for p in self.paths):
            if not src.exists():
                log.warning("Artifact %s was not produced in iteration %d; nothing to sort", src, iteration)
                continue
            dest_dir = self.out_dir / side
            dest_dir.mkdir(parents=True, exist_ok=True)
            dest = unique_path(dest_dir / self._name(src, iteration, verdict))
            check_write(src, f"iteration {iteration}'s artifact (artifacts.paths)")  # a move takes it away
            try:
                shutil.move(str(src), str(dest))
            except OSError as e:
                if src.exists():  # a move across file systems copies: the partial copy goes, the source stays
                    remove_partial(dest)
                raise ArtifactError(
                    f"cannot move artifact {src} to {dest} ({e.strerror}); check artifacts.dir"
                ) from None
            log.info("Sorted %s into %s", src, dest)
            moved.append(dest)
        self.sorted_count[side] += 1
        return moved

    def keep(self, iteration: int, artifact: Optional[Path], verdict: Verdict) -> Optional[Path]:
        """Copy the iteration artifact into ``intermediate/`` when ``keep_intermediate`` is on.

        Raises:
            ArtifactError: the copy cannot be made (a full disk): the partial copy is removed.
        """
        if not self.keep_intermediate or artifact is None or not Path(artifact).exists():
            return None
        dest_dir = self.out_dir / "intermediate"
        dest: Optional[Path] = None
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
            dest = unique_path(dest_dir / self._name(Path(artifact), iteration, verdict))
            if Path(artifact).is_dir():
                shutil.copytree(artifact, dest)
            else:
                shutil.copy2(artifact, dest)
                self._keep_external_data(Path(artifact), dest_dir)
        except OSError as e:
            if dest is not None:
                remove_partial(dest)
            raise ArtifactError(
                f"cannot keep iteration {iteration}'s artifact in {dest_dir} ({e.strerror}); free some space or "
                "set artifacts.keep_intermediate=false"
            ) from None
        return dest

    @staticmethod
    def _keep_external_data(artifact: Path, dest_dir: Path) -> None:
        """Copy the external data a kept ONNX artifact references beside its copy (once: a file of the same
        name and size is taken as the same; onnx refuses hard-linked data). A different file already
        there under that name is a warning, not an overwrite."""
        from runner.graph.model_files import model_files  # onnx, only where a kept model has external data

        for data in model_files(artifact)[1:]:
            target = dest_dir / data.name
            if not target.exists():
                shutil.copy2(data, target)
            elif target.stat().st_size != data.stat().st_size:
                log.warning(
                    "intermediate/%s exists and differs from %s; kept models that reference it may not load",
                    data.name,
                    data,
                )
