"""Every path a run writes, resolved and checked before the first check: no file the run reads is ever one,
and no file that no run of this tool wrote is ever replaced.

``plan_outputs`` resolves each output option once. A path that is a file the run reads (the model,
its external data, ``inputs=``, ``golden=``, ``replay.load=``, ``calibration.cache=``, a check's script:
``runner.files.inputs``), or a link to one (symbolic, also through a link to a file not yet created, or
hard), is a one-line error naming both paths and the key to change; so is an ``artifacts.paths`` entry
that is or contains one (artifacts are moved after each check). Two options naming the same file, also
through links, are an error; and each location is proved writable, so an unwritable ``output=`` stops the
run before the search, not after it.

One rule for what is there already. A name the run writes never replaces an existing file, unless the
user named the path and the file is one an earlier run of this tool wrote for the same key and nobody
changed since (``runner.files.ledger``), or ``overwrite=true`` is given; otherwise the run writes the first
free ``stem_N.suffix`` and says so in one warning line. A default name (``reduced.onnx``) never replaces
anything. The run's own files in its directory (``runner.files.rundir.RUN_NAMES``: vetted when the directory is
locked) are the run's; any other name there, such as ``output=`` inside a folder given as ``hydra.run.dir``, is held
to the rule above.

Each name is reserved by creating it empty (or, for a file that may be replaced, by opening it;
``runner.files.reservations``), and the run holds a ``flock`` on it until it ends: two runs started together
never get the same name, and an empty file that no running run holds is one a killed run (``kill -9``)
reserved and never wrote, which the next run takes back instead of moving on to ``reduced_1.onnx``. When the
run ends, the ledger records the files it wrote (``OutputPlan.release``).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

from runner.errors import ArtifactError, ConfigError
from runner.files.artifacts import ensure_writable_dir
from runner.files.inputs import same_file
from runner.files.ledger import record, run_file, written_for
from runner.files.reservations import abandoned, create_held, held, reserve
from runner.files.rundir import run_owns
from runner.write_guard import OWN_NAMES, is_device

log = logging.getLogger(__name__)


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
    #: ``{name this run created empty: the open descriptor holding its flock while the run lives}``
    reserved: Dict[Path, int] = field(default_factory=dict)
    #: ``{existing file this run may replace: the open descriptor holding its flock}``
    held: Dict[Path, int] = field(default_factory=dict)
    #: ``{path outside the run directory: its option}``, recorded in the ledger when the run ends
    named: Dict[Path, str] = field(default_factory=dict)

    def release(self) -> None:
        """Record in each directory's ledger the named outputs the run wrote, remove the names it reserved and
        left empty (it stopped before writing them), then let go of every lock."""
        record({path: option for path, option in self.named.items() if _written(path)})
        for path, fd in self.reserved.items():
            try:
                if path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass
            os.close(fd)
        for fd in self.held.values():
            os.close(fd)
        self.reserved.clear()
        self.held.clear()
        self.named.clear()

    def get(self, option: str) -> Optional[Path]:
        """The resolved path of ``option``, or None when the run does not write it."""
        return self.paths.get(option)


def _written(path: Path) -> bool:
    """Whether ``path`` is a regular file with content (an output the run wrote, not its empty reservation)."""
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size > 0


def _companions(option: str, path: Path, data_name: Optional[str] = None) -> List[Path]:
    """Files written beside ``path``: a model's external data file (``external_data_path=``'s name for the answers,
    else ``<name>.data``)."""
    if option not in MODEL_OUTPUTS:
        return []
    return [path.with_name(data_name if data_name and option in ANSWERS else path.name + ".data")]


#: options whose file is an ONNX model (may get ``<name>.data`` beside it)
MODEL_OUTPUTS = {"output", "min_good", "artifacts.iter_artifact"}
#: the models a run answers with: ``external_data_path=`` names their data file
ANSWERS = ("output", "min_good")


def plan_outputs(
    options: Dict[str, Optional[str | Path]],
    defaults: Dict[str, str],
    protected: Mapping[Path, str],
    artifact_paths: Iterable[str] = (),
    overwrite: bool = False,
    run_dir: Optional[Path] = None,
    data_name: Optional[str] = None,
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
        overwrite: ``overwrite=true``: a path the user named replaces the file there (never a protected one).
        run_dir: the run's own directory: its own files there (``runner.files.rundir.run_owns``) are neither reserved
            nor recorded.
        data_name: ``external_data_path=``: the data file ``output`` and ``min_good`` write beside them, held to
            the same rule (a file there that no run wrote for that key is refused: the name is yours, so it is
            not changed to a free one), or None for ``<name>.data``.

    Returns:
        The plan. Outputs outside the run directory are reserved (created empty, exclusively, or held
        open), so two runs started together never pick the same name; ``OutputPlan.release``
        records what was written and removes the names a failed run left empty.

    Raises:
        ArtifactError: an output is a protected file (or its data file would be, or a link leads
            there), two options name the same file, an ``artifacts.paths`` entry is or holds a
            protected file, or a location cannot be written.
        ConfigError: an output's directory does not exist.
    """
    plan = OutputPlan(protected={Path(p): what for p, what in protected.items()})
    try:
        _plan_into(plan, options, defaults, artifact_paths, overwrite, run_dir, data_name)
    except BaseException:
        plan.release()  # nothing of a refused plan stays behind
        raise
    return plan


def _plan_into(
    plan: OutputPlan,
    options: Dict[str, Optional[str | Path]],
    defaults: Dict[str, str],
    artifact_paths: Iterable[str],
    overwrite: bool,
    run_dir: Optional[Path],
    data_name: Optional[str] = None,
) -> None:
    requested: Dict[str, Path] = {}
    data_files: Dict[Path, str] = {}  # external_data_path's file of each answer: {path: option}
    for option, value in options.items():
        given = value or defaults.get(option)
        if not given:
            continue
        path = Path(given).absolute()
        if path.name in OWN_NAMES:
            raise ArtifactError(f"{option}={given}: {path.name} is this tool's own bookkeeping; choose another name")
        if is_device(path):
            if option != "log_file":
                raise ArtifactError(
                    f"{option}={given} is a device, not a file; name a file (log_file= may be a device: "
                    "log_file=/dev/null discards, as Polygraphy's --log-file does)"
                )
            plan.paths[option] = path  # written as the device it is: nothing reserved, replaced or recorded
            continue
        _check_writable(option, path)
        if value:
            _refuse_protected(plan, option, given, path)
        _refuse_shared(requested, option, path)
        requested[option] = path
        if run_dir is None or not run_owns(run_dir, path):
            data = option in MODEL_OUTPUTS and not (data_name and option in ANSWERS)
            path = _claim(plan, option, path, bool(value), overwrite, data)
            plan.named[path] = option
            if data:  # the model's ``<name>.data``, written with external data: recorded as this option's
                plan.named[_data_of(path)] = f"{option}:data"
        _refuse_protected(plan, option, given, path, data_name)
        _refuse_shared(plan.paths, option, path)
        _check_writable(option, path)
        plan.paths[option] = path
        if data_name and option in ANSWERS:
            _claim_data_file(plan, option, path.with_name(data_name), data_files, overwrite, run_dir)
    for entry in artifact_paths:
        moved = Path(entry.replace("{worker}", "0")).absolute()
        for p, what in plan.protected.items():
            if same_file(moved, p) or _inside(moved, p):
                how = "is" if same_file(moved, p) else "holds"
                raise ArtifactError(
                    f"artifacts.paths lists {entry}, which {how} {what} {p}; artifacts are moved into "
                    "good/ and bad/ after each check, so list only files or folders the check writes"
                )


def _refuse_shared(paths: Mapping[str, Path], option: str, path: Path) -> None:
    """Refuse ``path`` when another option (``paths``: ``{option: path}``) names the same file.

    Raises:
        ArtifactError: naming both options.
    """
    for other, other_path in paths.items():
        if other_path == path or same_file(path, other_path):
            raise ArtifactError(f"{option} and {other} both name {path}; give them different paths")


def _refuse_protected(
    plan: OutputPlan, option: str, given: str | Path, path: Path, data_name: Optional[str] = None
) -> None:
    """Refuse ``path`` (or the data file beside it) when it is, or leads to, a file the run reads.

    Raises:
        ArtifactError: naming both paths and the option to change.
    """
    for target in [path, *_companions(option, path, data_name)]:
        for p, what in plan.protected.items():
            if not same_file(target, p):
                continue
            if target == path:
                raise ArtifactError(f"{option}={given} would overwrite {what} {p}; choose another {option}=")
            if data_name and option in ANSWERS:  # the data file is the user's name: blame the key that gave it
                raise ArtifactError(
                    f"external_data_path={data_name} would overwrite {what} {p} (the data file beside {option}=); "
                    "choose another external_data_path="
                )
            raise ArtifactError(
                f"{option}={given} would overwrite {what} {p} (its external data file {target.name}); choose another "
                f"{option}="
            )


def _claim_data_file(
    plan: OutputPlan, option: str, path: Path, taken: Dict[Path, str], overwrite: bool, run_dir: Optional[Path]
) -> None:
    """Reserve the data file ``external_data_path=`` names beside ``option``'s model, or refuse it: it is the
    user's name, so a file there that no run of this tool wrote for it is never replaced (``overwrite=true``
    replaces it), and two answers in one folder would share it.

    Raises:
        ArtifactError: the file exists and is no earlier run's for this option, is held by a running run, or
            another answer writes it too.
    """
    key = f"{option}:external_data"
    if path in taken:
        raise ArtifactError(
            f"external_data_path={path.name}: {taken[path]}= and {option}= are in one folder and would share "
            f"{path}; put them in different folders"
        )
    taken[path] = option
    if run_dir is not None and run_owns(run_dir, path):
        return
    fd = create_held(path) if not os.path.lexists(path) else abandoned(path)
    if fd is not None:
        plan.reserved[path] = fd
    elif overwrite or written_for(path) == key:
        fd = held(path)
        if fd is None:
            raise ArtifactError(f"external_data_path={path.name}: {path} is being written by another run")
        plan.held[path] = fd
    else:
        raise ArtifactError(
            f"external_data_path={path.name}: {path} exists and no run of this tool wrote it for {option}=; choose "
            "another name, or overwrite=true to replace it"
        )
    plan.named[path] = key


def _data_of(path: Path) -> Path:
    """The data file a model written to ``path`` with external data gets beside it (``<name>.data``)."""
    return path.with_name(path.name + ".data")


def _claim(plan: OutputPlan, option: str, path: Path, named: bool, overwrite: bool, data: bool = False) -> Path:
    """The path ``option`` writes, reserved for this run: ``path`` itself when it is free, or when the user
    named it and it may be replaced (``overwrite``, or an earlier run wrote it for this option); else the
    first free ``stem_N.suffix``, with a warning line. With ``data`` (a model, whose external data goes to
    ``<name>.data`` beside it, and whose save removes a stale one there), a name is free only where that file is
    absent or an earlier run wrote it for this option (or ``overwrite`` for a name the user gave).

    Raises:
        OSError: the directory cannot be written.
    """

    def data_free(candidate: Path, may_replace: bool = False) -> bool:
        beside = _data_of(candidate)
        return not data or not os.path.lexists(beside) or may_replace or written_for(beside) == f"{option}:data"

    if not data_free(path, overwrite and named):
        free, taken = reserve(path, data_free)
        plan.reserved[free] = taken
        log.warning(
            "%s exists and no run of this tool wrote it for %s=; writing %s=%s instead, so that its external data "
            "never replaces that file%s",
            _data_of(path), option, option, free, " (overwrite=true replaces it)" if named else "",
        )  # fmt: skip
        return free
    fd = create_held(path) if not os.path.lexists(path) else None
    if fd is not None:
        plan.reserved[path] = fd
        return path
    fd = abandoned(path)  # an empty name a killed run reserved
    if fd is not None:
        plan.reserved[path] = fd
        return path
    if not named:
        free, fd = reserve(path, data_free)
        plan.reserved[free] = fd
        log.warning("%s exists; writing %s=%s instead (set %s= to choose)", path, option, free, option)
        return free
    writer = written_for(path) if path.is_file() else None
    if overwrite or writer == option:
        fd = held(path)
        if fd is not None:
            plan.held[path] = fd
            return path
        why = "is being written by another run"
    elif writer is not None:
        why = f"was written by an earlier run for {writer}=, not {option}=; overwrite=true replaces it"
    elif run_file(path):
        why = f"is an earlier run's own {path.name} (its run directory's), not an {option}=; overwrite=true replaces it"
    else:
        why = "exists and no run of this tool wrote it; overwrite=true replaces it"
    free, fd = reserve(path, data_free)
    plan.reserved[free] = fd
    log.warning("%s=%s %s; writing %s=%s instead", option, path, why, option, free)
    return free


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
