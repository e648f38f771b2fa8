"""Every file a run reads, named once before any work for the guard on what it writes (``runner.files.outputs``
before the run, ``runner.write_guard`` at every write).

Nothing a run writes or moves may be, contain or link to one of these: the model and its
external data files, ``quantized_model=`` and ``reference_model=`` and theirs, ``inputs=``, ``golden=``,
``replay.load=``, ``rankings=``, the module behind ``data_loader=`` or ``checker.target=``, the files
``checker.args`` names, and the files a check command names on its command line (its script, say, also as
``--option=FILE``).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from runner.graph.model_files import model_files


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same path once links are followed (also a link to a
    file not created yet), or hard links to one inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def script_target(target: str) -> Optional[Tuple[Path, str]]:
    """``(script, function)`` of a data loader given as a script, in Polygraphy's ``--data-loader-script``
    form: ``path/loader.py:fn``, or ``path/loader.py`` for its ``load_data``; None for ``pkg.module.fn``."""
    path, colon, fn = target.rpartition(":") if ":" in target else (target, "", "")
    if path.endswith(".py"):
        return Path(path), (fn if colon else "load_data") or "load_data"
    return None


def module_file(dotted: Optional[str]) -> Optional[Path]:
    """The source file of the module of ``pkg.module.fn`` (or of the script of ``loader.py:fn``), when it
    can be found without running it."""
    if dotted and script_target(dotted) is not None:
        script = script_target(dotted)
        assert script is not None
        return script[0].absolute() if script[0].is_file() else None
    if not dotted or "." not in dotted:
        return None
    module = dotted.rsplit(".", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that cannot be imported: loading reports it
        return None
    origin = spec.origin if spec is not None else None
    return Path(origin).absolute() if origin and Path(origin).is_file() else None


def command_files(cmd: Optional[str]) -> Iterable[Path]:
    """The existing files a check command names as arguments (its script, its data), not ``{artifact}``."""
    if not isinstance(cmd, str) or not cmd:
        return []
    try:
        words = shlex.split(cmd)
    except ValueError:  # unbalanced quotes: the checker reports them
        return []
    return named_files(words[1:])


def named_files(words: Iterable[object]) -> List[Path]:
    """The existing files among ``words`` (a command's arguments, ``checker.args``), also as the value of
    ``--option=FILE``; a word with ``{`` (a placeholder such as ``{artifact}``) names none."""
    found: List[Path] = []
    for word in words:
        if not isinstance(word, (str, Path)) or "{" in str(word):
            continue
        for text in (str(word), str(word).partition("=")[2]):
            try:
                if text and Path(text).is_file() and Path(text).absolute() not in found:
                    found.append(Path(text).absolute())
            except (OSError, ValueError):  # a name too long or with a NUL byte names no file
                continue
    return found


#: the data options whose file is an ONNX model: its external data files are read too
MODEL_OPTIONS = ("quantized_model", "reference_model")


def files_read(
    model: Optional[str],
    data: Dict[str, Optional[str]],
    modules: Sequence[Optional[str]] = (),
    check_cmd: Optional[str] = None,
    check_args: Sequence[object] = (),
) -> Dict[Path, str]:
    """``{absolute path: what it is}`` for every file the run reads.

    Args:
        model: ``model=``.
        data: ``{option: path}`` of data files (``inputs``, ``golden``, ``replay.load``,
            ``reference_model``, ``quantized_model``, ``rankings``); unset ones are None. A model's
            (``MODEL_OPTIONS``) external data files are among the files read.
        modules: dotted ``module.function`` names (``data_loader=``, ``checker.target=``).
        check_cmd: ``checker.cmd``.
        check_args: ``checker.args`` (a python check's arguments): those that are existing files.

    Returns:
        The files, first the model (``"the model"``), then its external data files, then the
        rest, each named by the option that reads it.
    """
    found: Dict[Path, str] = {}
    for i, path in enumerate(model_files(model)):
        found[path] = "the model" if i == 0 else "the model's external data file"
    for option, value in data.items():
        if not value or not _is_file(value):
            continue
        found.setdefault(Path(value).absolute(), f"the {option}= file")
        if option in MODEL_OPTIONS:
            for path in model_files(value)[1:]:
                found.setdefault(path, f"the {option}= model's external data file")
    for dotted in modules:
        source = module_file(dotted)
        if source is not None:
            found.setdefault(source, f"the module of {dotted}")
    for path in command_files(check_cmd):
        found.setdefault(path, "a file the check command names")
    for path in named_files(check_args if isinstance(check_args, (list, tuple)) else ()):
        found.setdefault(path, "a file checker.args names")
    return found


def _is_file(value: object) -> bool:
    try:
        return Path(str(value)).is_file()
    except (OSError, ValueError):
        return False
